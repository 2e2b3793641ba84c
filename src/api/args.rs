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
unsafe impl<'fcx> pgrx::callconv::ArgAbi<'fcx> for Regclass {
    unsafe fn unbox_arg_unchecked(arg: pgrx::callconv::Arg<'_, 'fcx>) -> Self {
        // Only reached for a non-NULL argument: every function takes `Option<Regclass>`.
        unsafe { arg.unbox_arg_using_from_datum() }.unwrap_or(Regclass(pg_sys::InvalidOid))
    }

    unsafe fn unbox_nullable_arg(
        arg: pgrx::callconv::Arg<'_, 'fcx>,
    ) -> pgrx::nullable::Nullable<Self> {
        unsafe { arg.unbox_arg_using_from_datum() }.into()
    }
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
