//! Kafka-target e2e tests, against Apache Kafka 4.4 (KRaft, one node on loopback; its jars
//! fetched once by `scripts/kafka.sh fetch`, which `scripts/setup.sh` runs).
//!
//! What is checked, against README "Kafka target":
//! - `convergence`: every topic replayed onto a copy (duplicate identities dropped) equals the
//!   source, by set difference both ways, after writes, a backfill, a kill -9 of the worker and a
//!   broker outage (the pipeline shows `error` with the reason, then catches up by itself); per
//!   key, one partition and increasing identities; no duplicate identity (exactly-once) after
//!   the kill -9, the outage and clean restarts; the pipeline's owner is an ordinary role
//!   (`GRANT tide_admin`);
//! - `exactly_once`: under a writer's load, three kill -9s of the worker, an immediate restart of
//!   PostgreSQL, a broker restart, a broker crash and a broker outage; a `read_committed`
//!   consumer then reads every change exactly once (per-key versions 1..=v in order, one insert
//!   message per source row) and the transaction topic's `BEGIN`/`END` records intact
//!   (`TIDE_TEST_DELIVERY=at-least-once` shows the same test failing without transactions);
//! - `fenced`: another producer that initialises the pipeline's transactional id fences it: the
//!   pipeline pauses with 55006 and the remedy, its batch stays invisible to `read_committed`;
//!   a resume fences the other producer and every change arrives once;
//! - `wallets`: a consumer that buffers by source transaction (the transaction topic's `END`
//!   records and the `transaction` block of each message) never sees a partial transfer, while a
//!   consumer that applies message by message does (the check can fail);
//! - `resync`: after a lost slot, every partition of each table's topic gets a `resync` start
//!   before the table's re-read rows and an end after them; a consumer that drops the keys it did
//!   not see between them ends with the source's rows (one that does not, does not);
//! - `refusals`: options, servers, user mappings and privileges refused with SQLSTATE and hint;
//!   secrets readable by no other role;
//! - `large`: one transaction of ~100 MB of messages goes through with the worker's memory flat;
//! - `schemas`: `value_format = 'debezium-schema'`, every field checked by its Connect schema;
//! - `masks`: a table with column masks: the topic replayed equals the masked source, and no
//!   message holds a clear value or the salt;
//! - `alter_table`: a row filter changed mid-stream: the altered schema message between the rows
//!   of either filter, and a consumer applying the new filter there ends with the source's rows;
//! - `debezium`: Debezium 3.6.1's PostgreSQL connector and pg_tide capture the same changes of
//!   the types suite's table into the same broker; the two topics agree message by message (key,
//!   op, before, after, source, transaction, Connect schemas) but for the differences it lists
//!   with their reasons (docs/kafka.md, "Compared with Debezium");
//! - `keyless`: a table without a key (`REPLICA IDENTITY FULL`), both value formats: no message
//!   has a key, none is a tombstone, every data message is on one partition, `before` of an
//!   update and a delete is the whole old row, and a consumer keeping a multiset of rows ends
//!   with the source's (duplicates included) after the copy and streamed changes, and again
//!   after a lost slot's resync;
//! - `jdbc_sink`: Debezium's JDBC sink connector reads a pg_tide topic as it is and its copy of
//!   the table equals the source after inserts, updates, deletes and key changes.
//!
//! Modules: `broker` (the suite's shared broker, a test's own that it stops and starts, and a
//! consumer that reads whole topics), `replay` (messages back into rows), `connect` (a Kafka
//! Connect standalone worker with Debezium's connectors, `scripts/debezium.sh`).

mod alter_table;
mod broker;
mod connect;
mod convergence;
mod debezium;
mod exactly_once;
mod fenced;
mod jdbc_sink;
mod keyless;
mod large;
mod masks;
mod refusals;
mod replay;
mod resync;
mod schemas;
mod wallets;
