//! Releases and installations: the oldest release `sql/releases.txt` names, the version under
//! test, a private PostgreSQL copy holding chosen pg_tide files, and [`CATALOG_SNAPSHOT`], the
//! listing by which two installs of the extension are compared (the upgrade test; the `upgrade`
//! golden file).

use crate::{repo_root, run_ok};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Run a repository script; its stdout (trimmed), or a panic with its output.
pub fn run_repo_script(args: &[&str]) -> String {
    run_ok(Command::new("bash").args(args).current_dir(repo_root()))
}

/// The oldest release named in `sql/releases.txt`.
pub fn oldest_release() -> String {
    let list =
        std::fs::read_to_string(repo_root().join("sql/releases.txt")).expect("sql/releases.txt");
    list.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .and_then(|l| l.split_whitespace().next())
        .expect("sql/releases.txt names a release")
        .to_string()
}

/// The PostgreSQL major version of `TIDE_PG_BIN`'s installation (its `pg_config --version`).
pub fn pg_major() -> u32 {
    let out = Command::new(crate::pg_bin().join("pg_config"))
        .arg("--version")
        .output()
        .expect("pg_config --version");
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .strip_prefix("PostgreSQL ")
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("cannot read a major version from pg_config --version: {text}"))
}

/// The newest release named in `sql/releases.txt` other than the version under test that
/// supports the PostgreSQL version under test (`scripts/release.sh --previous`): the one a DBA
/// upgrades from today (the upgrade test installs it). Panics when there is none
/// (`scripts/e2e-lanes.sh` does not run the upgrade suite then).
pub fn previous_release() -> String {
    let v = run_ok(
        Command::new("bash")
            .args(["scripts/release.sh", "--previous"])
            .current_dir(repo_root())
            .env("TIDE_PG", pg_major().to_string()),
    );
    assert!(
        !v.is_empty(),
        "sql/releases.txt names no release before the version under test that supports PostgreSQL {}",
        pg_major()
    );
    v
}

/// The version of the build under test (the extension crate's).
pub fn current_version() -> String {
    let toml = std::fs::read_to_string(repo_root().join("Cargo.toml")).expect("Cargo.toml");
    toml.lines()
        .find_map(|l| {
            l.strip_prefix("version = \"")
                .and_then(|r| r.strip_suffix('"'))
        })
        .expect("a version in Cargo.toml")
        .to_string()
}

/// `pg_config --pkglibdir` and `--sharedir`/extension of the installation of `bin`.
pub fn install_dirs(bin: &Path) -> (PathBuf, PathBuf) {
    let q = |flag: &str| {
        let out = Command::new(bin.join("pg_config"))
            .arg(flag)
            .output()
            .expect("pg_config");
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    };
    (q("--pkglibdir"), q("--sharedir").join("extension"))
}

/// Unlink every pg_tide file of an installation (unlinking never disturbs a server that maps
/// the library; this copy is the test's own anyway).
pub fn remove_pg_tide_files(bin: &Path) {
    let (lib, ext) = install_dirs(bin);
    for dir in [lib, ext] {
        let real = dir.canonicalize().expect("installation directory");
        assert!(
            real.starts_with(repo_root().join("target")),
            "{} is not inside the private copy (it resolves to {}): refusing to remove files there",
            dir.display(),
            real.display()
        );
        for e in std::fs::read_dir(&dir)
            .expect("installation directory")
            .flatten()
        {
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with("pg_tide") && e.path().is_file() && !e.path().is_symlink() {
                std::fs::remove_file(e.path()).expect("remove an old pg_tide file");
            }
        }
    }
}

/// A private PostgreSQL copy in `target/NAME` (`scripts/private-pg.sh`) holding exactly these
/// pg_tide files: the build under test (those of `TIDE_PG_BIN`'s installation, which
/// `scripts/install.sh` put there) and, from the oldest release's tree (`scripts/release.sh`,
/// built once per machine), its install script only, so that `CREATE EXTENSION pg_tide VERSION
/// '<oldest>'` makes the old catalog while the new library runs. Returns the copy's bin
/// directory.
///
/// The install script is the same whatever PostgreSQL version it was built for, and releases
/// before 0.3.0 build for 15 only: it is taken from the release's build for 15.
pub fn private_pg_with_oldest_script(name: &str) -> PathBuf {
    let from = oldest_release();
    let old_tree = PathBuf::from(run_ok(
        Command::new("bash")
            .args(["scripts/release.sh", &from])
            .current_dir(repo_root())
            .env("TIDE_PG", "15")
            .env_remove("TIDE_PG_BIN"),
    ));
    let old_script = find_file(&old_tree, &format!("pg_tide--{from}.sql")).unwrap_or_else(|| {
        panic!(
            "pg_tide--{from}.sql missing from the release tree {}",
            old_tree.display()
        )
    });
    let bin = PathBuf::from(run_repo_script(&[
        "scripts/private-pg.sh",
        &repo_root().join("target").join(name).to_string_lossy(),
    ]));
    remove_pg_tide_files(&bin);
    let staging = repo_root()
        .join("target")
        .join(format!("{name}-old-script"));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).expect("create the staging directory");
    std::fs::copy(&old_script, staging.join(old_script.file_name().unwrap()))
        .expect("copy the old install script");
    let (lib, ext) = install_dirs(&crate::pg_bin());
    run_repo_script(&[
        "scripts/install-tree.sh",
        &bin.to_string_lossy(),
        &lib.to_string_lossy(),
        &ext.to_string_lossy(),
        &staging.to_string_lossy(),
    ]);
    bin
}

/// The first file named `name` under `dir` (depth first).
pub fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() && !p.is_symlink() {
            if let Some(found) = find_file(&p, name) {
                return Some(found);
            }
        } else if e.file_name().to_string_lossy() == name && p.is_file() {
            return Some(p);
        }
    }
    None
}

/// One line per property of every object of the extension in the current database, sorted: what
/// two installs of the same version must agree on. OIDs and data are left out.
pub const CATALOG_SNAPSHOT: &str = r#"
WITH ext AS (SELECT * FROM pg_extension WHERE extname = 'pg_tide'),
members AS (
    SELECT d.classid, d.objid FROM pg_depend d, ext
     WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'
),
ns AS (SELECT oid FROM pg_namespace WHERE nspname = 'tide'),
rels AS (SELECT c.* FROM pg_class c, ns WHERE c.relnamespace = ns.oid),
lines(line) AS (
    SELECT format('extension version=%s schema=%s relocatable=%s config=%s condition=%s',
                  extversion, extnamespace::regnamespace, extrelocatable,
                  (SELECT string_agg(x::regclass::text, ',' ORDER BY x::regclass::text) FROM unnest(extconfig) x),
                  array_to_string(extcondition, ','))
      FROM ext
    UNION ALL
    SELECT 'member ' || pg_describe_object(m.classid, m.objid, 0) FROM members m
    UNION ALL
    SELECT format('schema %s owner=%s acl=%s comment=%s', n.nspname, n.nspowner::regrole, n.nspacl,
                  obj_description(n.oid, 'pg_namespace'))
      FROM pg_namespace n, ns WHERE n.oid = ns.oid
    UNION ALL
    SELECT format('function %s returns %s args=%s lang=%s kind=%s volatile=%s strict=%s secdef=%s parallel=%s leakproof=%s cost=%s rows=%s config=%s src=%s bin=%s owner=%s acl=%s comment=%s',
                  p.oid::regprocedure, pg_get_function_result(p.oid), pg_get_function_arguments(p.oid),
                  l.lanname, p.prokind, p.provolatile, p.proisstrict, p.prosecdef, p.proparallel,
                  p.proleakproof, p.procost, p.prorows, array_to_string(p.proconfig, ','), md5(p.prosrc),
                  p.probin, p.proowner::regrole, p.proacl, obj_description(p.oid, 'pg_proc'))
      FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang, ns WHERE p.pronamespace = ns.oid
    UNION ALL
    SELECT format('relation %s kind=%s persistence=%s rls=%s force_rls=%s options=%s owner=%s acl=%s comment=%s%s',
                  c.oid::regclass, c.relkind, c.relpersistence, c.relrowsecurity, c.relforcerowsecurity,
                  array_to_string(c.reloptions, ','), c.relowner::regrole, c.relacl,
                  obj_description(c.oid, 'pg_class'),
                  CASE c.relkind WHEN 'v' THEN ' definition=' || pg_get_viewdef(c.oid)
                                 WHEN 'i' THEN ' definition=' || pg_get_indexdef(c.oid) ELSE '' END)
      FROM rels c
    UNION ALL
    SELECT format('sequence %s type=%s start=%s increment=%s min=%s max=%s cache=%s cycle=%s',
                  s.seqrelid::regclass, s.seqtypid::regtype, s.seqstart, s.seqincrement, s.seqmin,
                  s.seqmax, s.seqcache, s.seqcycle)
      FROM pg_sequence s JOIN rels c ON c.oid = s.seqrelid
    UNION ALL
    -- columns by position among the live ones (a dropped column leaves a gap in attnum only)
    SELECT format('column %s.%s position=%s type=%s not_null=%s default=%s identity=%s generated=%s collation=%s acl=%s comment=%s',
                  c.oid::regclass, quote_ident(a.attname),
                  row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum),
                  format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid),
                  a.attidentity, a.attgenerated,
                  CASE WHEN a.attcollation <> 0 THEN a.attcollation::regcollation::text END,
                  a.attacl, col_description(c.oid, a.attnum))
      FROM rels c
      JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
      LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE c.relkind IN ('r', 'v', 'p', 'm', 'f')
    UNION ALL
    SELECT format('constraint %s %s %s deferrable=%s comment=%s', k.conrelid::regclass, k.conname,
                  pg_get_constraintdef(k.oid), k.condeferrable, obj_description(k.oid, 'pg_constraint'))
      FROM pg_constraint k JOIN rels c ON c.oid = k.conrelid
    UNION ALL
    SELECT format('policy %s %s cmd=%s permissive=%s roles=%s using=%s check=%s', p.polrelid::regclass,
                  p.polname, p.polcmd, p.polpermissive,
                  (SELECT string_agg(x, ',' ORDER BY x)
                     FROM (SELECT CASE WHEN r = 0 THEN 'public' ELSE r::regrole::text END AS x
                             FROM unnest(p.polroles) r) rs),
                  pg_get_expr(p.polqual, p.polrelid), pg_get_expr(p.polwithcheck, p.polrelid))
      FROM pg_policy p JOIN rels c ON c.oid = p.polrelid
    UNION ALL
    SELECT 'trigger ' || pg_get_triggerdef(t.oid)
      FROM pg_trigger t JOIN rels c ON c.oid = t.tgrelid WHERE NOT t.tgisinternal
    UNION ALL
    SELECT format('type %s type=%s', t.oid::regtype, t.typtype)
      FROM pg_type t, ns WHERE t.typnamespace = ns.oid AND t.typrelid = 0 AND t.typelem = 0
)
SELECT line FROM lines ORDER BY line
"#;
