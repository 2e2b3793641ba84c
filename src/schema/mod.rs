//! The SQL objects of the extension that are not Rust functions: catalog tables, the outbox,
//! views, privileges, and the event triggers: `tide_schema_changes` (with its SQL functions
//! `tide._shape`, `tide._schema_change`, `tide._schema_marker`, which also refuses a replica
//! identity other than FULL for a table captured without a key) and `tide_dropped_tables`
//! (`tide._drop_marker`), the places outside `catalog` that write pg_tide's tables, in the DDL's
//! own transaction, because they must run in SQL there; `tide_followed_schemas` runs the C
//! function `tide._follow_tables` of `api::follow`. The Rust code that reads and writes these
//! tables lives in `catalog`.
//!
//! The SQL is in two files beside this one, run in this order by `CREATE EXTENSION`:
//! `catalog.sql` first (the tables, before every generated object), and `objects.sql` last
//! (functions in SQL, views, event triggers and privileges, after every Rust function they
//! call). A change here changes the install script: it needs the same change in the open
//! upgrade script (`sql/pg_tide--0.3.0--0.4.0.sql`), which the regress suite's `upgrade`
//! transcript checks.

use pgrx::extension_sql_file;

extension_sql_file!("catalog.sql", name = "catalog", bootstrap);

extension_sql_file!("objects.sql", name = "views", finalize);
