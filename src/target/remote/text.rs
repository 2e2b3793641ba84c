//! Result columns as text: which types are read directly in PostgreSQL's text output format,
//! and the check that a statement returns only those.

use super::*;

/// A result column decoded from its binary wire format into PostgreSQL's text output.
pub(super) struct AnyText(String);

/// True if [`AnyText`] can decode a column of type `ty`.
pub(super) fn readable(ty: &Type) -> bool {
    match ty.kind() {
        Kind::Enum(_) => true,
        Kind::Domain(base) => readable(base),
        _ => {
            <String as FromSql>::accepts(ty)
                || [
                    Type::JSON,
                    Type::JSONB,
                    Type::BOOL,
                    Type::INT2,
                    Type::INT4,
                    Type::INT8,
                    Type::OID,
                    Type::PG_LSN,
                    Type::UUID,
                    Type::BYTEA,
                ]
                .contains(ty)
        }
    }
}

/// Lower-case hex of `bytes`.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Decode one non-NULL value of a [`readable`] type to its text output.
pub(super) fn text_of(
    ty: &Type,
    raw: &[u8],
) -> Result<String, Box<dyn std::error::Error + Sync + Send>> {
    if let Kind::Domain(base) = ty.kind() {
        return text_of(base, raw);
    }
    if matches!(ty.kind(), Kind::Enum(_)) || *ty == Type::JSON {
        return Ok(std::str::from_utf8(raw)?.to_string());
    }
    if <String as FromSql>::accepts(ty) {
        return <String as FromSql>::from_sql(ty, raw);
    }
    Ok(match *ty {
        Type::JSONB => match raw.split_first() {
            Some((1, json)) => std::str::from_utf8(json)?.to_string(),
            _ => return Err("unsupported jsonb binary format version".into()),
        },
        Type::BOOL => if bool::from_sql(ty, raw)? { "t" } else { "f" }.to_string(),
        Type::INT2 => i16::from_sql(ty, raw)?.to_string(),
        Type::INT4 => i32::from_sql(ty, raw)?.to_string(),
        Type::INT8 => i64::from_sql(ty, raw)?.to_string(),
        Type::OID => u32::from_sql(ty, raw)?.to_string(),
        Type::PG_LSN => PgLsn::from_sql(ty, raw)?.to_string(),
        Type::UUID => {
            if raw.len() != 16 {
                return Err("invalid uuid length".into());
            }
            format!(
                "{}-{}-{}-{}-{}",
                hex(&raw[0..4]),
                hex(&raw[4..6]),
                hex(&raw[6..8]),
                hex(&raw[8..10]),
                hex(&raw[10..16])
            )
        }
        Type::BYTEA => format!("\\x{}", hex(raw)),
        _ => return Err(format!("cannot read type {ty} as text").into()),
    })
}

impl<'a> FromSql<'a> for AnyText {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        text_of(ty, raw).map(AnyText)
    }

    fn accepts(ty: &Type) -> bool {
        readable(ty)
    }
}

/// Fail (before execution) if a result column cannot be returned as text.
pub(super) fn check_columns(statement: &Statement) -> Result<(), RemoteError> {
    for (i, column) in statement.columns().iter().enumerate() {
        if !readable(column.type_()) {
            return Err(RemoteError::permanent(format!(
                "result column {} (\"{}\") has type {}, which the remote sink cannot return as text",
                i + 1,
                column.name(),
                column.type_()
            ))
            .with_hint("cast the column to text in the SQL, e.g. expr::text"));
        }
    }
    Ok(())
}

/// Every value of every row, as text.
pub(super) fn rows_as_text(rows: &[Row]) -> Result<Rows, RemoteError> {
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let mut values = Vec::with_capacity(row.len());
        for i in 0..row.len() {
            let value: Option<AnyText> = row.try_get(i).map_err(|e| {
                RemoteError::permanent(format!(
                    "could not read result column {}: {}",
                    i + 1,
                    error_chain(&e)
                ))
            })?;
            values.push(value.map(|v| v.0));
        }
        out.push(values);
    }
    Ok(out)
}
