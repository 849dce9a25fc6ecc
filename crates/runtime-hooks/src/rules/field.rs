//! A field of a rule object: the error naming a field that does not parse ([`FieldError`]), and
//! the readers of a JSON object's fields the parsers share (`serde_json::Value` in, a typed value
//! or `None` for a missing field out, a [`FieldError`] for a wrong type).

use serde_json::Value;

/// A field of an object that does not parse: which field (its JSON path, e.g.
/// `spec.resourceUsedThresholdWithBE.cpuSuppressPolicy`) and why. The caller names the object.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldError {
    /// JSON path of the field within the object.
    pub field: String,
    /// What is wrong with its value, quoting the value.
    pub reason: String,
}

impl FieldError {
    /// A field error.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> FieldError {
        FieldError { field: field.into(), reason: reason.into() }
    }
}

/// The value at `path` under `v` (`Null` when any step is missing or `null`).
pub fn lookup(v: &Value, path: &[&str]) -> Value {
    let mut cur = v;
    for key in path {
        match cur.get(key) {
            Some(next) => cur = next,
            None => return Value::Null,
        }
    }
    cur.clone()
}

fn type_error(field: &str, want: &str, v: &Value) -> FieldError {
    FieldError::new(field, format!("{v} is not {want}"))
}

/// A boolean field's value: `None` when `v` is `Null` (missing).
///
/// Errors: any other type, a [`FieldError`] naming `field` and quoting the value.
pub fn bool_field(v: &Value, field: &str) -> Result<Option<bool>, FieldError> {
    match v {
        Value::Null => Ok(None),
        Value::Bool(b) => Ok(Some(*b)),
        other => Err(type_error(field, "a boolean", other)),
    }
}

/// An integer field's value (an `i64`): `None` when `v` is `Null` (missing).
///
/// Errors: any other type, or a number that is not an `i64`, a [`FieldError`] naming `field`
/// and quoting the value.
pub fn int_field(v: &Value, field: &str) -> Result<Option<i64>, FieldError> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => n.as_i64().map(Some).ok_or_else(|| type_error(field, "an integer", v)),
        other => Err(type_error(field, "an integer", other)),
    }
}

/// A string field's value: `None` when `v` is `Null` (missing).
///
/// Errors: any other type, a [`FieldError`] naming `field` and quoting the value.
pub fn string_field(v: &Value, field: &str) -> Result<Option<String>, FieldError> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        other => Err(type_error(field, "a string", other)),
    }
}
