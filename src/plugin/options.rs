//! The plugin's options (`pg_logical_slot_*_changes(..., 'name', 'value', ...)` or a worker's
//! START_REPLICATION): parsed once at startup into `Options`.
//!
//! Guarantees: an unknown or malformed option is an ERROR (22023) with a hint listing the
//! accepted ones; a `masks.<relid>` value or the `mask_salt` is never repeated in an error.

use super::Masked;
use pgrx::pg_sys;
use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use tide_core::wire;

fn option_string(def: *mut pg_sys::DefElem) -> (String, String) {
    // SAFETY: private, called only by parse_options with an element of the context's options list:
    // a DefElem PostgreSQL built with a NUL-terminated `defname` and a NULL or string `arg` (what
    // defGetString reads).
    unsafe {
        let name = CStr::from_ptr((*def).defname)
            .to_string_lossy()
            .into_owned();
        let value = if (*def).arg.is_null() {
            String::new()
        } else {
            CStr::from_ptr(pg_sys::defGetString(def))
                .to_string_lossy()
                .into_owned()
        };
        (name, value)
    }
}

fn invalid_option(message: String) -> ! {
    crate::error::TideError::invalid(message)
        .hint(format!(
            "pg_tide accepts the options proto_version ('{}'), tables (comma-separated relation OIDs), streaming ('on' or 'off'), row_filter.<relation OID> (a row filter), row_filter_owner (a role OID), columns.<relation OID> (comma-separated attribute numbers), masks.<relation OID> (a JSON object of attribute numbers and masks) and mask_salt (hex).",
            wire::PROTO_VERSION
        ))
        .raise()
}

/// The plugin's options (see `invalid_option`'s hint).
pub(super) struct Options {
    pub(super) tables: Option<HashSet<pg_sys::Oid>>,
    /// Whether to stream transactions in progress (`streaming 'on'`).
    pub(super) streaming: bool,
    pub(super) row_filters: HashMap<pg_sys::Oid, String>,
    pub(super) filter_owner: Option<pg_sys::Oid>,
    pub(super) column_lists: HashMap<pg_sys::Oid, std::rc::Rc<Vec<bool>>>,
    pub(super) masks: HashMap<pg_sys::Oid, std::rc::Rc<Masked>>,
    pub(super) salt: Vec<u8>,
}

/// A `masks.<relid>` option: the relation, and each attribute's mask by number - 1. The value
/// is never repeated in an error (it is a pipeline's own setting, but only its names matter).
fn parse_masks(name: &str, value: &str) -> (pg_sys::Oid, Masked) {
    let relid = name["masks.".len()..].parse::<u32>();
    let parsed = tide_core::mask::Masks::parse(value).and_then(|m| {
        let mut out: Masked = Vec::new();
        for (attnum, mask) in m.columns {
            let a = attnum
                .parse::<usize>()
                .ok()
                .filter(|&a| a > 0 && a <= pg_sys::MaxHeapAttributeNumber as usize)
                .ok_or_else(|| format!("\"{attnum}\" is not an attribute number"))?;
            if out.len() < a {
                out.resize(a, None);
            }
            out[a - 1] = Some(mask);
        }
        Ok(out)
    });
    match (relid, parsed) {
        (Ok(oid), Ok(m)) => (pg_sys::Oid::from(oid), m),
        (_, Err(why)) => invalid_option(format!(
            "pg_tide output plugin: option \"{name}\" is not a JSON object of attribute numbers and masks: {why}"
        )),
        (Err(_), _) => invalid_option(format!(
            "pg_tide output plugin: option \"{name}\" does not name a relation OID"
        )),
    }
}

/// The `mask_salt` option (hex); its value is never repeated in an error.
fn parse_salt(value: &str) -> Vec<u8> {
    let v = value.trim();
    let bytes: Option<Vec<u8>> = v
        .len()
        .is_multiple_of(2)
        .then(|| {
            (0..v.len())
                .step_by(2)
                .map(|i| v.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
                .collect()
        })
        .flatten();
    bytes.unwrap_or_else(|| {
        invalid_option("pg_tide output plugin: option mask_salt is not hexadecimal".into())
    })
}

/// Read the options a decoding session was started with; an unknown or malformed one is an
/// ERROR (22023).
pub(super) unsafe fn parse_options(list: *mut pg_sys::List) -> Options {
    // SAFETY: `list` is the context's `output_plugin_options`: NULL or a List of `length` DefElem
    // pointers, built by PostgreSQL in the decoding context's memory and alive for the whole
    // startup.
    unsafe {
        let mut tables = None;
        let mut streaming = false;
        let mut row_filters = HashMap::new();
        let mut filter_owner = None;
        let mut column_lists = HashMap::new();
        let mut masks = HashMap::new();
        let mut salt = Vec::new();
        if !list.is_null() {
            for i in 0..(*list).length {
                let def = (*(*list).elements.add(i as usize)).ptr_value as *mut pg_sys::DefElem;
                let (name, value) = option_string(def);
                match name.as_str() {
                    "proto_version" => {
                        if value.trim() != wire::PROTO_VERSION.to_string() {
                            invalid_option(format!(
                                "pg_tide output plugin: unsupported proto_version \"{value}\" (this server speaks {})",
                                wire::PROTO_VERSION
                            ));
                        }
                    }
                    "tables" => {
                        let mut set = HashSet::new();
                        for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                            match part.parse::<u32>() {
                                Ok(oid) => {
                                    set.insert(pg_sys::Oid::from(oid));
                                }
                                Err(_) => invalid_option(format!(
                                    "pg_tide output plugin: \"{part}\" in option tables is not a relation OID"
                                )),
                            }
                        }
                        tables = Some(set);
                    }
                    "streaming" => {
                        streaming = match value.trim() {
                            "on" | "true" | "1" => true,
                            "off" | "false" | "0" => false,
                            other => invalid_option(format!(
                                "pg_tide output plugin: option streaming must be 'on' or 'off', not \"{other}\""
                            )),
                        }
                    }
                    "row_filter_owner" => match value.trim().parse::<u32>() {
                        Ok(oid) => filter_owner = Some(pg_sys::Oid::from(oid)),
                        Err(_) => invalid_option(format!(
                            "pg_tide output plugin: \"{value}\" in option row_filter_owner is not a role OID"
                        )),
                    },
                    other if other.starts_with("columns.") => {
                        let relid = other["columns.".len()..].parse::<u32>();
                        let attnums: Result<Vec<usize>, _> = value
                            .split(',')
                            .map(|a| a.trim().parse::<usize>())
                            .collect();
                        match (relid, attnums) {
                            (Ok(oid), Ok(attnums)) if attnums.iter().all(|&a| a > 0) => {
                                let max = attnums.iter().copied().max().unwrap_or(0);
                                let mut mask = vec![false; max];
                                for a in attnums {
                                    mask[a - 1] = true;
                                }
                                column_lists.insert(pg_sys::Oid::from(oid), std::rc::Rc::new(mask));
                            }
                            _ => invalid_option(format!(
                                "pg_tide output plugin: option \"{other}\" = \"{value}\" is not a relation OID with attribute numbers"
                            )),
                        }
                    }
                    "mask_salt" => salt = parse_salt(&value),
                    other if other.starts_with("masks.") => {
                        let (oid, m) = parse_masks(other, &value);
                        masks.insert(oid, std::rc::Rc::new(m));
                    }
                    other if other.starts_with("row_filter.") => {
                        match other["row_filter.".len()..].parse::<u32>() {
                            Ok(oid) => {
                                row_filters.insert(pg_sys::Oid::from(oid), value);
                            }
                            Err(_) => invalid_option(format!(
                                "pg_tide output plugin: option \"{other}\" does not name a relation OID"
                            )),
                        }
                    }
                    other => {
                        invalid_option(format!("pg_tide output plugin: unknown option \"{other}\""))
                    }
                }
            }
        }

        Options {
            tables,
            streaming,
            row_filters,
            filter_owner,
            column_lists,
            masks,
            salt,
        }
    }
}
