//! The stream model that the worker and the targets share: relation descriptors, the metadata of
//! a source transaction being applied, and the closed sets of names the catalog and the outbox
//! store as text (event ops, watermark kinds, marker ops, backfill states, target kinds, where a
//! consumer starts, why the outbox retention deleted events).
//!
//! Owns: these types and their text forms. Guarantees: every enum's `as_str` is the exact text
//! stored in pg_tide's tables (the `CHECK` constraints of `src/schema.rs` list the same words),
//! and `parse(as_str(x)) == Some(x)`; `parse` of any other text is `None`, never a default.
//! Nothing here touches PostgreSQL: the worker (`src/worker`) and the targets (`src/target`)
//! both depend on this module and never on each other's types.

use crate::json::ColumnDesc;
use crate::lsn::Lsn;

/// Rows per backfill chunk unless told otherwise (`tide.start_backfill`'s default).
pub const DEFAULT_CHUNK_SIZE: i32 = 5000;

/// A column of a captured relation, as the worker and the targets need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedColumn {
    pub name: String,
    pub type_oid: u32,
    /// Part of the replica-identity key.
    pub key: bool,
}

impl ColumnDesc for OwnedColumn {
    fn name(&self) -> &str {
        &self.name
    }
    fn type_oid(&self) -> u32 {
        self.type_oid
    }
    fn is_key(&self) -> bool {
        self.key
    }
}

/// A captured relation: its schema-qualified, quoted name and its columns in attribute order
/// (as the output plugin sends them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelDesc {
    pub qualified: String,
    pub columns: Vec<OwnedColumn>,
}

/// The source transaction being applied. Set by the worker at `BEGIN`, updated per change, read
/// by the targets; never persisted (the target stores the applied LSN instead).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Txn {
    pub xid: u32,
    /// The commit LSN: with `position`, the identity of each of its events.
    pub lsn: Lsn,
    pub commit_time: i64,
    /// Already applied (at or below the target's applied position): a replay, decoded only to
    /// follow pg_tide's own rows in it.
    pub skip: bool,
    /// Events of this transaction written so far (the next one is `position + 1`).
    pub position: i32,
    /// The transaction added a table the decoder was not filtering for: what follows it must be
    /// decoded again with a reopened decoder.
    pub barrier: bool,
}

/// A schema change of a captured table, as the event trigger `tide._schema_marker` describes it
/// in a `schema` marker's payload (`tide._schema_change` in `src/schema.rs`; the outbox's
/// `schema` event carries the same JSON, see README "Outbox format"). Columns are matched by
/// attribute number, so a column dropped and added again under its name is dropped and added.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SchemaChange {
    /// The columns after the change, in attribute order: (name, `format_type`).
    pub columns: Vec<(String, String)>,
    /// The key after the change, in key order.
    pub key: Vec<String>,
    /// The key before the change.
    pub previous_key: Vec<String>,
    /// Columns added: (name, `format_type`, the value rows that existed got: `attmissingval`,
    /// or `None` for NULL).
    pub added: Vec<(String, String, Option<String>)>,
    /// Columns dropped, by name.
    pub dropped: Vec<String>,
    /// Columns whose type changed: (name, from, to).
    pub changed: Vec<(String, String, String)>,
    /// Columns renamed: (from, to).
    pub renamed: Vec<(String, String)>,
}

impl SchemaChange {
    /// Parse a marker's payload; `None` for anything that is not one (a missing or mistyped
    /// field), never a partial change.
    pub fn parse(payload: &str) -> Option<SchemaChange> {
        use serde_json::Value;
        let v: Value = serde_json::from_str(payload).ok()?;
        let text = |v: &Value, k: &str| v.get(k)?.as_str().map(str::to_string);
        let list = |k: &str| v.get(k)?.as_array();
        let names = |k: &str| -> Option<Vec<String>> {
            list(k)?
                .iter()
                .map(|x| x.as_str().map(str::to_string))
                .collect()
        };
        Some(SchemaChange {
            columns: list("columns")?
                .iter()
                .map(|c| Some((text(c, "name")?, text(c, "type")?)))
                .collect::<Option<_>>()?,
            key: names("key")?,
            previous_key: match v.get("previous_key") {
                None | Some(Value::Null) => Vec::new(),
                Some(_) => names("previous_key")?,
            },
            added: list("added")?
                .iter()
                .map(|c| {
                    let value = match c.get("value") {
                        None | Some(Value::Null) => None,
                        Some(x) => Some(x.as_str()?.to_string()),
                    };
                    Some((text(c, "name")?, text(c, "type")?, value))
                })
                .collect::<Option<_>>()?,
            dropped: names("dropped")?,
            changed: list("changed")?
                .iter()
                .map(|c| Some((text(c, "name")?, text(c, "from")?, text(c, "to")?)))
                .collect::<Option<_>>()?,
            renamed: list("renamed")?
                .iter()
                .map(|c| Some((text(c, "from")?, text(c, "to")?)))
                .collect::<Option<_>>()?,
        })
    }

    /// Whether the key changed (columns or their order).
    pub fn key_changed(&self) -> bool {
        self.key != self.previous_key
    }
}

/// Declares a closed set of names with its text form (`as_str`, `parse`, `ALL`).
macro_rules! text_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The text pg_tide stores for this value.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The value whose text is `s`; `None` for any other text.
            pub fn parse(s: &str) -> Option<$name> {
                match s {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

text_enum! {
    /// What an event does to its row (`tide.outbox.op`). Set by the worker from the decoded
    /// change (`read` for backfilled rows); persisted in the outbox.
    Op {
        Insert => "insert",
        Update => "update",
        Delete => "delete",
        Truncate => "truncate",
        /// A row of a backfill chunk, emitted at the chunk's high watermark.
        Read => "read",
        /// A schema change of the relation (`ALTER TABLE`), at the position where it takes
        /// effect; the event's row describes it (README, "Outbox format").
        Schema => "schema",
        /// A resync of the relation after its pipeline's slot was lost starts or ends (README,
        /// "Outbox format", Resync events). Written by `catalog::slots`, outbox only.
        Resync => "resync",
    }
}

text_enum! {
    /// Which watermark of a chunk a row of `tide.signal` is (`tide.signal.kind`). Written by the
    /// worker only: `low` before the chunk is read, `high` after; decoded back from the stream.
    WatermarkKind {
        Low => "low",
        High => "high",
    }
}

text_enum! {
    /// What a row of `tide.marker` marks (`tide.marker.op`). Written by the SQL API
    /// (`add_table`, `remove_table`) in the transaction that changes the table list, and by the
    /// event trigger `tide._schema_marker` (`schema`) in the transaction of an `ALTER TABLE`
    /// that changed a captured table's columns or key; decoded by the worker, which acts on it
    /// at exactly that commit position in the stream.
    MarkerOp {
        AddTable => "add_table",
        RemoveTable => "remove_table",
        /// A captured table's columns or key changed; the marker's payload says how.
        Schema => "schema",
        /// `tide.alter_table` changed a captured table's row filter or column list; the
        /// marker's payload is the schema event that announces it (with the new shaping).
        AlterTable => "alter_table",
    }
}

text_enum! {
    /// The state of a backfill (`tide.backfill.state`, persisted). Set by the SQL API (`queued`
    /// at start and resume, `paused`, `cancelled`) and by the worker (`running` when it reads
    /// the first chunk, `done` at the last chunk's high watermark, `failed` with the reason).
    BackfillState {
        Queued => "queued",
        Running => "running",
        Paused => "paused",
        Done => "done",
        Cancelled => "cancelled",
        Failed => "failed",
    }
}

impl BackfillState {
    /// Not finished: at most one such backfill per pipeline and table.
    pub const fn is_active(self) -> bool {
        matches!(
            self,
            BackfillState::Queued | BackfillState::Running | BackfillState::Paused
        )
    }
}

text_enum! {
    /// Where a pipeline writes (`tide.pipeline.target`, persisted; set by `create_pipeline`).
    TargetKind {
        /// The `tide.outbox` table.
        Outbox => "outbox",
        /// A table in the same database.
        Table => "table",
        /// A table in a remote PostgreSQL (a `postgres_fdw` server).
        Postgres => "postgres",
        /// Topics of a Kafka cluster (a `tide_kafka` foreign server).
        Kafka => "kafka",
    }
}

text_enum! {
    /// Where a new outbox consumer starts (`tide.create_consumer(..., start)`; not persisted: it
    /// only decides the first committed position).
    ConsumerStart {
        /// Before the oldest event of the pipeline still in the outbox: it reads them all.
        Earliest => "earliest",
        /// At the newest event of the pipeline: it reads only what is written after.
        Latest => "latest",
    }
}

text_enum! {
    /// Why the outbox retention deleted a pipeline's events (`tide.outbox_prune.last_reason`,
    /// persisted; written by the launcher with each batch it deletes).
    PruneReason {
        /// The pipeline has consumers and every one of them had committed the events.
        Consumers => "consumers",
        /// The pipeline has no consumer and the events were older than `tide.outbox_retention`.
        Age => "age",
    }
}

text_enum! {
    /// How a backfill chunk's surviving rows reached the target (`tide.chunk.written_as`,
    /// persisted; written by the worker with the chunk). Which one a chunk takes is the
    /// target's choice, per chunk.
    ChunkWrite {
        /// One `read` event per row (the outbox; table targets whose columns differ in type).
        Events => "events",
        /// Row values, inserted in bulk by the table access method (a local table target that
        /// holds none of the chunk's keys and allows it).
        Bulk => "bulk",
        /// Row values, through one `INSERT ... ON CONFLICT` (a local table target otherwise).
        Upsert => "upsert",
        /// COPY text sent to a remote target (straight into the table when it holds none of the
        /// chunk's keys, else through a staging table and an upsert).
        Copy => "copy",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn text_forms_round_trip_and_are_distinct() {
        fn check<T: Copy + PartialEq + std::fmt::Debug>(
            all: &[T],
            as_str: fn(T) -> &'static str,
            parse: fn(&str) -> Option<T>,
        ) {
            let mut seen = std::collections::HashSet::new();
            for &v in all {
                assert_eq!(parse(as_str(v)), Some(v));
                assert!(seen.insert(as_str(v)), "{} twice", as_str(v));
            }
        }
        check(Op::ALL, Op::as_str, Op::parse);
        check(
            WatermarkKind::ALL,
            WatermarkKind::as_str,
            WatermarkKind::parse,
        );
        check(
            BackfillState::ALL,
            BackfillState::as_str,
            BackfillState::parse,
        );
        check(TargetKind::ALL, TargetKind::as_str, TargetKind::parse);
        check(MarkerOp::ALL, MarkerOp::as_str, MarkerOp::parse);
        check(
            ConsumerStart::ALL,
            ConsumerStart::as_str,
            ConsumerStart::parse,
        );
        check(PruneReason::ALL, PruneReason::as_str, PruneReason::parse);
        check(ChunkWrite::ALL, ChunkWrite::as_str, ChunkWrite::parse);
        assert_eq!(Op::ALL.len(), 7);
        assert_eq!(BackfillState::ALL.len(), 6);
    }

    #[test]
    fn schema_change_parses_the_trigger_payload() {
        let p = r#"{"columns":[{"name":"id","type":"integer","type_oid":23,"typmod":-1},{"name":"note","type":"text","type_oid":25,"typmod":-1}],
                   "key":["id"],"previous_key":["id"],
                   "added":[{"name":"note","type":"text","value":"x"},{"name":"n2","type":"integer","value":null}],
                   "dropped":["old"],"changed":[{"name":"v","from":"integer","to":"bigint"}],
                   "renamed":[{"from":"a","to":"b"}]}"#;
        let c = SchemaChange::parse(p).unwrap();
        assert_eq!(c.columns[1], ("note".into(), "text".into()));
        assert_eq!(c.added[0].2.as_deref(), Some("x"));
        assert_eq!(c.added[1].2, None);
        assert_eq!(c.dropped, ["old"]);
        assert_eq!(c.changed[0].2, "bigint");
        assert_eq!(c.renamed[0], ("a".into(), "b".into()));
        assert!(!c.key_changed());
        let k = SchemaChange::parse(
            &p.replace(r#""previous_key":["id"]"#, r#""previous_key":["id","x"]"#),
        )
        .unwrap();
        assert!(k.key_changed());
        // a mistyped or missing field is not a change
        assert_eq!(
            SchemaChange::parse(&p.replace(r#""dropped":["old"]"#, r#""dropped":[1]"#)),
            None
        );
        assert_eq!(
            SchemaChange::parse(&p.replace(r#""key":["id"],"#, "")),
            None
        );
        assert_eq!(SchemaChange::parse("not json"), None);
    }

    #[test]
    fn active_states() {
        let active: Vec<_> = BackfillState::ALL
            .iter()
            .filter(|s| s.is_active())
            .map(|s| s.as_str())
            .collect();
        // The partial unique index backfill_one_active of src/schema.rs lists the same three.
        assert_eq!(active, ["queued", "running", "paused"]);
    }

    proptest! {
        /// No text but the declared ones parses: nothing becomes a silent default.
        #[test]
        fn other_text_never_parses(s in ".{0,12}") {
            let declared = |s: &str| Op::ALL.iter().any(|v| v.as_str() == s)
                || WatermarkKind::ALL.iter().any(|v| v.as_str() == s)
                || BackfillState::ALL.iter().any(|v| v.as_str() == s)
                || TargetKind::ALL.iter().any(|v| v.as_str() == s)
                || MarkerOp::ALL.iter().any(|v| v.as_str() == s)
                || ConsumerStart::ALL.iter().any(|v| v.as_str() == s)
                || PruneReason::ALL.iter().any(|v| v.as_str() == s)
                || ChunkWrite::ALL.iter().any(|v| v.as_str() == s);
            prop_assume!(!declared(&s));
            prop_assert_eq!(Op::parse(&s), None);
            prop_assert_eq!(WatermarkKind::parse(&s), None);
            prop_assert_eq!(BackfillState::parse(&s), None);
            prop_assert_eq!(TargetKind::parse(&s), None);
            prop_assert_eq!(MarkerOp::parse(&s), None);
            prop_assert_eq!(ConsumerStart::parse(&s), None);
            prop_assert_eq!(PruneReason::parse(&s), None);
            prop_assert_eq!(ChunkWrite::parse(&s), None);
        }

        /// Case and padding matter: the stored text is exact.
        #[test]
        fn near_misses_do_not_parse(i in 0usize..6, upper in any::<bool>()) {
            let t = Op::ALL[i].as_str();
            let near = if upper { t.to_uppercase() } else { format!(" {t}") };
            prop_assert_eq!(Op::parse(&near), None);
        }
    }
}
