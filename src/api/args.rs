//! Arguments of the SQL API: every function takes its arguments as `Option`s (so none is STRICT
//! and silently returns NULL) and checks them here, once, with the argument's name.
//!
//! - a NULL where a value is required: 22004 `argument "<name>" must not be NULL`;
//! - a `regclass` that names no relation (e.g. `0::regclass`): 42P01.

use crate::error::{TideError, TideResult};
use pgrx::pg_sys;
use pgrx::{FromDatum, IntoDatum};

/// A `regclass` argument: only its OID, nothing opened or locked (unlike `PgRelation`, which
/// panics on an OID that names no relation).
#[derive(Clone, Copy, Debug)]
pub struct Regclass(pub pg_sys::Oid);

impl FromDatum for Regclass {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _typoid: pg_sys::Oid,
    ) -> Option<Self> {
        if is_null {
            None
        } else {
            // SAFETY: FromDatum of an Oid reads the Datum's integer as an Oid: any value is valid,
            // and it is not NULL (checked above).
            Some(Regclass(unsafe { pg_sys::Oid::from_datum(datum, false)? }))
        }
    }
}

impl IntoDatum for Regclass {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(pg_sys::Datum::from(self.0))
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::REGCLASSOID
    }
}

pgrx::impl_sql_translatable!(Regclass, "regclass");

// How pgrx unboxes an argument of this type (as it does for its own `FromDatum` types).
// SAFETY: Regclass is an Oid passed by value: pgrx's `unbox_arg_using_from_datum` unboxes it
// exactly as it does an Oid argument, which is what the SQL signature (`regclass`) passes.
unsafe impl<'fcx> pgrx::callconv::ArgAbi<'fcx> for Regclass {
    unsafe fn unbox_arg_unchecked(arg: pgrx::callconv::Arg<'_, 'fcx>) -> Self {
        // Only reached for a non-NULL argument: every function takes `Option<Regclass>`.
        // SAFETY: `arg` is the argument pgrx hands to this function for the `regclass` parameter it
        // declared, a by-value Oid.
        unsafe { arg.unbox_arg_using_from_datum() }.unwrap_or(Regclass(pg_sys::InvalidOid))
    }

    unsafe fn unbox_nullable_arg(
        arg: pgrx::callconv::Arg<'_, 'fcx>,
    ) -> pgrx::nullable::Nullable<Self> {
        // SAFETY: `arg` is the argument pgrx hands to this function for the `regclass` parameter it
        // declared, a by-value Oid (NULL handled by Nullable).
        unsafe { arg.unbox_arg_using_from_datum() }.into()
    }
}

/// A `pg_lsn` argument (a WAL position).
#[derive(Clone, Copy, Debug)]
pub struct PgLsn(pub u64);

impl FromDatum for PgLsn {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _typoid: pg_sys::Oid,
    ) -> Option<Self> {
        // pg_lsn is an int8 by value (XLogRecPtr).
        (!is_null).then(|| PgLsn(datum.value() as u64))
    }
}

impl IntoDatum for PgLsn {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(pg_sys::Datum::from(self.0 as usize))
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::PG_LSNOID
    }
}

pgrx::impl_sql_translatable!(PgLsn, "pg_lsn");

// SAFETY: PgLsn is a pg_lsn (a 64-bit integer passed by value): pgrx's `unbox_arg_using_from_datum`
// unboxes it through PgLsn's FromDatum, as it does its own by-value types.
unsafe impl<'fcx> pgrx::callconv::ArgAbi<'fcx> for PgLsn {
    unsafe fn unbox_arg_unchecked(arg: pgrx::callconv::Arg<'_, 'fcx>) -> Self {
        // Only reached for a non-NULL argument: every function takes `Option<PgLsn>`.
        // SAFETY: `arg` is the argument pgrx hands to this function for the `pg_lsn` parameter it
        // declared, a by-value 64-bit integer.
        unsafe { arg.unbox_arg_using_from_datum() }.unwrap_or(PgLsn(0))
    }

    unsafe fn unbox_nullable_arg(
        arg: pgrx::callconv::Arg<'_, 'fcx>,
    ) -> pgrx::nullable::Nullable<Self> {
        // SAFETY: `arg` is the argument pgrx hands to this function for the `pg_lsn` parameter it
        // declared, a by-value 64-bit integer (NULL handled by Nullable).
        unsafe { arg.unbox_arg_using_from_datum() }.into()
    }
}

/// A `jsonb` argument, parsed into a `serde_json::Value` here instead of by pgrx's `JsonB`,
/// which panics (an XX000 with pgrx's internals) on a value `serde_json` cannot hold: a number
/// beyond `f64` (`1e400`) or nesting deeper than 128 levels. Such a value is kept as the error
/// text, reported by [`json_arg`] as 22023 with the argument's name.
#[derive(Clone, Debug)]
pub struct JsonbArg(pub Result<serde_json::Value, String>);

impl FromDatum for JsonbArg {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _typoid: pg_sys::Oid,
    ) -> Option<Self> {
        if is_null {
            return None;
        }
        // SAFETY: a non-NULL jsonb datum (as pgrx's JsonB reads it); jsonb_out returns a
        // palloc'd C string, copied here.
        let text = unsafe {
            let out =
                pgrx::direct_function_call::<&std::ffi::CStr>(pg_sys::jsonb_out, &[Some(datum)])?;
            let s = out.to_string_lossy().into_owned();
            pg_sys::pfree(out.as_ptr() as *mut std::ffi::c_void);
            s
        };
        Some(JsonbArg(
            serde_json::from_str(&text).map_err(|e| e.to_string()),
        ))
    }
}

impl IntoDatum for JsonbArg {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        pgrx::JsonB(self.0.ok()?).into_datum()
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

pgrx::impl_sql_translatable!(JsonbArg, "jsonb");

// SAFETY: JsonbArg is unboxed through its FromDatum, which reads a non-NULL `jsonb` Datum
// with jsonb_out; pgrx's `unbox_arg_using_from_datum` is how pgrx unboxes its own FromDatum
// types.
unsafe impl<'fcx> pgrx::callconv::ArgAbi<'fcx> for JsonbArg {
    unsafe fn unbox_arg_unchecked(arg: pgrx::callconv::Arg<'_, 'fcx>) -> Self {
        // Only reached for a non-NULL argument: every function takes `Option<JsonbArg>`.
        // SAFETY: `arg` is the argument pgrx hands to this function for the `jsonb` parameter it
        // declared, a (possibly toasted) jsonb pointer valid for the call.
        unsafe { arg.unbox_arg_using_from_datum() }.unwrap_or(JsonbArg(Err("NULL".to_string())))
    }

    unsafe fn unbox_nullable_arg(
        arg: pgrx::callconv::Arg<'_, 'fcx>,
    ) -> pgrx::nullable::Nullable<Self> {
        // SAFETY: `arg` is the argument pgrx hands to this function for the `jsonb` parameter it
        // declared, a (possibly toasted) jsonb pointer valid for the call (NULL handled by
        // Nullable).
        unsafe { arg.unbox_arg_using_from_datum() }.into()
    }
}

/// A required `jsonb` argument that `serde_json` can hold (22004 for NULL, 22023 otherwise).
pub fn json_arg(v: Option<JsonbArg>, name: &str) -> TideResult<serde_json::Value> {
    required(v, name)?.0.map_err(|e| {
        TideError::invalid(format!("argument \"{name}\" is not JSON pg_tide can read: {e}"))
            .hint("Numbers must fit a double precision (about 1e308), and nesting stay within 128 levels.")
    })
}

fn null(name: &str) -> TideError {
    TideError::new(
        pg_sys::errcodes::PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
        format!("argument \"{name}\" must not be NULL"),
    )
    .hint(format!(
        "Pass a value for {name}, or omit it where it has a default."
    ))
}

/// A required argument.
pub fn required<T>(v: Option<T>, name: &str) -> TideResult<T> {
    v.ok_or_else(|| null(name))
}

/// A required `regclass` argument naming an existing relation.
pub fn relation(v: Option<Regclass>, name: &str) -> TideResult<pg_sys::Oid> {
    let oid = required(v, name)?.0;
    let exists = crate::sql::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class WHERE oid = $1)",
        &[oid.into()],
    )?
    .unwrap_or(false);
    if exists {
        Ok(oid)
    } else {
        Err(TideError::new(
            pg_sys::errcodes::PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!("relation with OID {} does not exist", oid.to_u32()),
        )
        .hint(format!(
            "Pass an existing table as {name}, e.g. 'public.orders'."
        )))
    }
}
