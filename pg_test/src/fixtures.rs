//! Schemas and scripts that several suites share, written once.
//!
//! The wallets: `WALLETS` wallets of `WALLET_START_BALANCE` each, and transfers between them
//! (the table target's and the kafka target's "no reader sees half a transfer" scenarios).

/// Wallets in [`WALLET_SCHEMA`].
pub const WALLETS: i64 = 1000;
/// Each wallet's balance before any transfer.
pub const WALLET_START_BALANCE: i64 = 1000;

/// `wallets`, a `ledger` of transfers and `transfer_check`: `transfer_check.net` is the wallet's
/// net transfers, updated in the same transaction as the balance, so `balance = 1000 + net` holds
/// in every committed state of the source (and the ledger sums to the same net). The wallets and
/// their check rows are filled; the ledger is empty.
pub const WALLET_SCHEMA: &str = "
CREATE TABLE wallets (id int PRIMARY KEY, balance bigint NOT NULL);
CREATE TABLE ledger (id bigserial PRIMARY KEY, from_id int, to_id int, amount bigint);
CREATE TABLE transfer_check (wallet_id int PRIMARY KEY, net bigint NOT NULL);
INSERT INTO wallets SELECT g, 1000 FROM generate_series(1, 1000) g;
INSERT INTO transfer_check SELECT g, 0 FROM generate_series(1, 1000) g;
";

/// A pgbench script of one transfer per transaction: two UPDATEs of wallets (in id order: no
/// deadlocks), the two transfer_check rows, one ledger row.
pub const WALLET_TRANSFER_SCRIPT: &str = r#"\set from random(1, 1000)
\set off random(1, 999)
\set to 1 + ((:from - 1 + :off) % 1000)
\set amt random(1, 100)
\set lo least(:from, :to)
\set hi greatest(:from, :to)
\set dlo case when :lo = :from then -:amt else :amt end
\set dhi -:dlo
BEGIN;
UPDATE wallets SET balance = balance + :dlo WHERE id = :lo;
UPDATE wallets SET balance = balance + :dhi WHERE id = :hi;
UPDATE transfer_check SET net = net + :dlo WHERE wallet_id = :lo;
UPDATE transfer_check SET net = net + :dhi WHERE wallet_id = :hi;
INSERT INTO ledger (from_id, to_id, amount) VALUES (:from, :to, :amt);
COMMIT;
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wallet_constants_match_the_schema_and_script() {
        assert!(WALLET_SCHEMA.contains(&format!("generate_series(1, {WALLETS})")));
        assert!(WALLET_SCHEMA.contains(&format!("SELECT g, {WALLET_START_BALANCE} FROM")));
        assert!(WALLET_TRANSFER_SCRIPT.contains(&format!("random(1, {WALLETS})")));
    }
}
