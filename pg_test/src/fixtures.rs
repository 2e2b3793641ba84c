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

/// The types suite (pg_test/tests/table_target/types.rs; the kafka suite's Debezium comparison
/// uses the same table): types and the objects they need, created on the source and (for the
/// remote) on the target.
pub const TYPES_SUITE_TYPES: &str = r#"
CREATE TYPE mood AS ENUM ('sad', 'ok', 'it''s "fine"');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE TYPE pair AS (a int, b text);
"#;

pub const TYPES_SUITE_TABLE: &str = r#"
CREATE TABLE ty (
    id        int PRIMARY KEY,
    c_int2    smallint, c_int8 bigint, c_num numeric(30,10), c_numany numeric,
    c_real    real, c_dbl double precision, c_bool boolean, c_money money,
    c_text    text, c_vc varchar(10), c_ch char(5), c_bytea bytea, c_uuid uuid,
    c_date    date, c_time time, c_timetz timetz, c_ts timestamp, c_tstz timestamptz,
    c_iv      interval, c_json json, c_jsonb jsonb, c_xml xml,
    c_intarr  int[], c_textarr text[], c_numarr numeric[],
    c_enum    mood, c_dom posint, c_pair pair,
    c_inet    inet, c_cidr cidr, c_mac macaddr,
    c_point   point, c_box box, c_circle circle, c_line line, c_lseg lseg, c_path path, c_poly polygon,
    c_range   int4range, c_mrange int4multirange, c_tsrange tstzrange,
    c_tsv     tsvector, c_tsq tsquery, c_bit bit(4), c_varbit varbit, c_lsn pg_lsn,
    "Mixed Case ""col""" text
)"#;

/// Row `id` with every tricky value (the all-NULL row is `id % 5 == 4`).
pub fn types_suite_row(id: i32) -> String {
    let v = match id % 5 {
        0 => r#"-32768, -9223372036854775808, 12345678901234567890.0123456789, 'NaN',
                '-0', '-Infinity', true, '-1234.56',
                E'He said "hi" \\ back\\slash\nline 2\ttab ünïcødé 😀', 'ünï "x"', 'ab', '\x00ff10', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
                '0044-03-15 BC', '23:59:59.999999', '12:00:00+05:30', '2000-01-01 00:00:00.123456', '2024-06-01 12:34:56.789+02',
                '1 year 2 mons 3 days 04:05:06.789', '{"b": 1,   "a": [1, 2.50, "x"], "a": "dup"}', 'null', '<a x="1">t &amp; u</a>',
                '{1,2,NULL,4}', ARRAY['a "q"', NULL, 'b\c', '', 'NULL', 'x,y', '{}'], '{1.50,NaN,-0.001}',
                'it''s "fine"', 42, ROW(1, 'x "y", z')::pair,
                '192.168.1.5/24', '10.0.0.0/8', '08:00:2b:01:02:03',
                '(1.5,-2.25)', '((0,0),(1,1))', '<(1,2),3>', '{1,-1,0}', '[(0,0),(1,1)]', '[(0,0),(1,1),(2,0)]', '((0,0),(1,1),(1,0))',
                '[1,10)', '{[1,3), [5,7)}', '[2024-01-01 00:00:00+00,infinity)',
                'a fat cat sat', 'fat & (rat | cat)', B'1010', B'101', '16/B374D848',
                E'quote'' and \\'"#,
        1 => r#"0, 9223372036854775807, -0.0000000001, 'Infinity',
                'Infinity', '5e-324', false, '0',
                '', '', 'abcde', '\x', '00000000-0000-0000-0000-000000000000',
                'infinity', '00:00:00', '00:00:00-12', '-infinity', 'infinity',
                '-1 day -00:00:01', '"str\u00e9"', '"just a string"', '<b/>',
                '{{1,2},{3,4}}', '{}', '{}',
                'sad', 1, ROW(NULL, NULL)::pair,
                '::1', '::/0', '00:00:00:00:00:00',
                '(0,0)', '((0,0),(0,0))', '<(0,0),0>', '{0,1,0}', '[(0,0),(0,0)]', '((0,0))', '((0,0))',
                'empty', '{}', 'empty',
                '', '!x', B'0000', B'', '0/0',
                'x'"#,
        2 => r#"1, 1, 0, '-Infinity',
                'NaN', 'NaN', true, '92233720368547758.07',
                'NULL', 'NULL', 'NULL', '\x5c4e', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12',
                '2024-02-29', '12:00:00', '12:00:00+00', '1999-12-31 23:59:59', '1999-12-31 23:59:59+00',
                '00:00:00', 'null', '{"k": "v", "n": null, "e": "\u00e9"}', '<!-- c --><x/>',
                '{NULL}', '{NULL,""}', '{0}',
                'ok', 7, ROW(0, '')::pair,
                '10.1.2.3', '10.1.0.0/16', 'ff:ff:ff:ff:ff:ff',
                '(-1e-300,1e300)', '((1,1),(-1,-1))', '<(1,1),0.5>', '{1,0,-1}', '[(1,1),(2,2)]', '[(1,2)]', '((1,2),(3,4),(5,6))',
                '(,)', '{(,)}', '(,)',
                'ünï', 'a <-> b', B'1111', B'1', 'FFFFFFFF/FFFFFFFF',
                '\N'"#,
        3 => r#"-1, -1, 1e-10, '0',
                '1e-45', '1.7976931348623157e308', false, '-0.01',
                E'ctl \x01\x1f end {"not": "json"}', E'tab\there', E'a\tb', '\xdeadbeef', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a13',
                '4713-01-01 BC', '24:00:00', '24:00:00-15:59', '0001-01-01 00:00:00 BC', '0001-01-01 00:00:00+00 BC',
                '-178000000 years', E'[1, 2.50,\n\t 3e2]', '[1, "two", {"3": [4]}]', 'just text',
                '{-2147483648}', '{"\\", "\""}', '{1e-100}',
                'it''s "fine"', 2147483647, ROW(-1, '(,)')::pair,
                '255.255.255.255/32', '0.0.0.0/0', '01:02:03:04:05:06',
                '(NaN,0)', '((1,2),(1,2))', '<(-5,-5),10>', '{1,1,1}', '[(-1,-1),(1,1)]', '((1,1),(2,2))', '((0,0),(0,0),(0,0))',
                '[-2147483648,2147483647)', '{[1,2), [3,4), [5,6)}', '[-infinity,2024-01-01)',
                '''quoted'' lexeme', '!(a & b)', B'0101', B'10101010101', 'A/B',
                ''"#,
        _ => "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
              NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
              NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
              NULL, NULL",
    };
    format!("INSERT INTO ty VALUES ({id}, {v})")
}
