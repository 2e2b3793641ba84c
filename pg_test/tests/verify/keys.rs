//! `tide.verify` and `tide.repair` for every kind of key the capture supports, at a local and a
//! remote target: timestamptz, date, time, numeric, uuid, text under a non-default collation,
//! and a composite key mixing them. Each table's target is corrupted behind pg_tide's back (a row
//! deleted, one changed, one added); verify must report exactly those, repair must fix them, and
//! verify must then report nothing.

use crate::common::*;

/// (table, key columns' definitions, key column list, the key expression of row `g`). Every
/// table has `v int NOT NULL` beside its key; 300 rows, `g` from 1.
const TABLES: &[(&str, &str, &str, &str)] = &[
    (
        "k_tstz",
        "k timestamptz",
        "k",
        "timestamptz '2024-03-01 00:00:00+00' + g * interval '37 minutes 1.5 seconds'",
    ),
    ("k_date", "k date", "k", "date '1999-12-01' + g * 3"),
    ("k_time", "k time", "k", "time '00:00' + g * interval '4 minutes 0.25 seconds'"),
    ("k_num", "k numeric", "k", "g * 1.25 - 100"),
    ("k_uuid", "k uuid", "k", "md5(g::text)::uuid"),
    (
        "k_coll",
        "k text COLLATE \"{coll}\"",
        "k",
        "chr(65 + (g % 2) * 32 + (g / 2) % 26) || g",
    ),
    (
        "k_mix",
        "a date, b timestamptz, c numeric, d text COLLATE \"{coll}\", e uuid, f time",
        "a, b, c, d, e, f",
        "date '2020-01-01' + g / 50, timestamptz '2024-01-01 00:00+00' + (g % 7) * interval '1 hour', \
         (g % 3) * 0.5, chr(97 + g % 3) || chr(65 + g % 2), md5(g::text)::uuid, time '12:00' + (g % 5) * interval '1 minute'",
    ),
];

/// Verify (ranges of about 50 keys), corrupt, verify, repair, verify, on pipeline `p` whose
/// targets are on `tc` in schema `schema`.
fn keys_scenario(c: &Cluster, tc: &Cluster, p: &str, schema: &str) {
    let coll = interleaving_collation(c);
    for (t, cols, key, expr) in TABLES {
        let cols = cols.replace("{coll}", &coll);
        exec(
            c,
            &format!(
                "CREATE TABLE {t} ({cols}, v int NOT NULL, PRIMARY KEY ({key}));
                 INSERT INTO {t} SELECT {expr}, g FROM generate_series(1, 300) g;
                 SELECT tide.add_table('{p}', '{t}');"
            ),
        );
    }
    for (t, _, key, expr) in TABLES {
        wait_backfill(c, t, p, 120);
        let cols = format!("{key}, v");
        let target = format!("{schema}.{t}");
        assert_same_rows(t, c, t, tc, &target, &cols);
        let v = verify(c, &format!("'{t}', '{p}', ranges => 6"));
        assert_eq!(v.differ, 0, "{t}: a clean target\n{}", v.dump());
        assert_eq!(v.summary.target_rows, 300, "{t}\n{}", v.dump());
        // Behind pg_tide's back: the first row deleted, the 150th changed, one row added (the
        // 301st of the same expression).
        tc.execute(&format!(
            "DELETE FROM {target} WHERE ({key}) IN (SELECT {key} FROM {target} ORDER BY {key} LIMIT 1);
             UPDATE {target} SET v = -1 WHERE ({key}) IN (SELECT {key} FROM {target} ORDER BY {key} OFFSET 150 LIMIT 1);
             INSERT INTO {target} SELECT {expr}, 0 FROM generate_series(301, 301) g;"
        ));
        let v = verify(c, &format!("'{t}', '{p}', ranges => 6"));
        let (missing, extra, changed) = v.ranges.iter().fold((0, 0, 0), |(m, e, ch), r| {
            (m + r.missing, e + r.extra, ch + r.changed)
        });
        assert_eq!(
            (missing, extra, changed),
            (1, 1, 1),
            "{t}: one missing, one extra, one changed\n{}",
            v.dump()
        );
        let r = repair(c, &format!("'{t}', '{p}'"));
        assert!(
            r.backfill_id.is_some(),
            "{t}: a repair backfill: {}",
            r.action
        );
        wait_backfill(c, t, p, 120);
        wait_pipeline(c, p, 60);
        assert_same_rows(&format!("{t} after the repair"), c, t, tc, &target, &cols);
        let v = verify(c, &format!("'{t}', '{p}', ranges => 6"));
        assert_eq!(v.differ, 0, "{t}: repaired\n{}", v.dump());
    }
}

#[test]
fn every_key_type_local() {
    let c = setup("verify_keys_local");
    create_pipeline(&c, "kl", "table", r#"{"schema": "rep"}"#);
    keys_scenario(&c, &c, "kl", "rep");
}

#[test]
fn every_key_type_remote() {
    let c = setup("verify_keys_remote");
    let t = target_cluster("verify_keys_remote_tgt");
    create_server(&c, "tgt", &t);
    create_pipeline(&c, "kr", "postgres", r#"{"server": "tgt"}"#);
    keys_scenario(&c, &t, "kr", "public");
}
