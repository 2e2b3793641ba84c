//! The clusters a suite starts from: a source with pg_tide created and its supervisor running, a
//! plain remote target, and the postgres_fdw server that points the one at the other.

use crate::{Cluster, ClusterBuilder};
use std::time::Duration;

/// Init and start a cluster, retrying with another port when the start fails (a client socket
/// in TIME-WAIT can hold the port `cluster.sh` picked).
pub fn start_cluster(b: ClusterBuilder) -> Cluster {
    let mut failed = Vec::new();
    for attempt in 1..=4 {
        let c = b.clone().init();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.start())) {
            Ok(()) => return c,
            Err(_) => {
                eprintln!(
                    "pg_test: cluster {} did not start (attempt {attempt}), trying another port",
                    c.name()
                );
                failed.push(c);
            }
        }
    }
    panic!("no cluster could be started in 4 attempts");
}

/// A started cluster (pg_tide preloaded, `wal_level = logical`) with the extension created and
/// its supervisor running (a database's launcher starts with its first pipeline).
pub fn setup(name: &str) -> Cluster {
    let c = start_cluster(Cluster::builder(name));
    init_extension(&c);
    c
}

/// `CREATE EXTENSION pg_tide` on a started cluster, then wait (30 s at most) for its supervisor
/// (no launcher: a database has one only while it has pipelines, and `create_pipeline` asks for
/// it).
pub fn init_extension(c: &Cluster) {
    c.execute("CREATE EXTENSION pg_tide");
    c.wait_until(
        "the pg_tide supervisor",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_tide supervisor'",
            )? == 1)
        },
    );
}

/// A plain scratch cluster to serve as a remote target (pg_tide not preloaded).
pub fn target_cluster(name: &str) -> Cluster {
    start_cluster(Cluster::builder(name).no_preload())
}

/// On `src`: postgres_fdw, a foreign server `server` pointing at `tgt`, and a user mapping for
/// postgres (the harness clusters use trust auth, so no password).
pub fn create_server(src: &Cluster, server: &str, tgt: &Cluster) {
    src.execute(&format!(
        "CREATE EXTENSION IF NOT EXISTS postgres_fdw;
         CREATE SERVER {server} FOREIGN DATA WRAPPER postgres_fdw
                OPTIONS (host '127.0.0.1', port '{}', dbname 'postgres');
         CREATE USER MAPPING FOR postgres SERVER {server} OPTIONS (user 'postgres');",
        tgt.port()
    ));
}

/// A source ([`setup`] of `name`) and a remote target ([`target_cluster`] `<name>_tgt`), with the
/// foreign server `tgt` on the source pointing at the target.
pub fn setup_remote(name: &str) -> (Cluster, Cluster) {
    let c = setup(name);
    let t = target_cluster(&format!("{name}_tgt"));
    create_server(&c, "tgt", &t);
    (c, t)
}
