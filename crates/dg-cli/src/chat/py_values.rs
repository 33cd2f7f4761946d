//! JSON values as template values that print as Python prints them: transformers renders chat
//! templates with Python's Jinja, where a float prints as `repr(float)` (`1e-07`, `1e+20`), while
//! minijinja prints every float in positional notation (`0.0000001`, `100000000000000000000.0`).
//! Floats Python writes with an exponent become objects that print Python's text; everything else
//! converts to the matching template value.

use std::fmt;
use std::sync::Arc;

use minijinja::Value;
use minijinja::value::{Object, ObjectRepr};
use serde_json::Value as Json;

/// `json` as a template value.
pub fn to_value(json: &Json) -> Value {
    match json {
        Json::Array(items) => Value::from(items.iter().map(to_value).collect::<Vec<_>>()),
        Json::Object(map) => Value::from_pairs(map.iter().map(|(k, v)| (k.as_str(), to_value(v)))),
        Json::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Value::from(i),
            (None, Some(u), _) => Value::from(u),
            (None, None, Some(x)) => exponent_repr(x).map_or_else(|| Value::from(x), |text| Value::from_object(PyFloat(text))),
            (None, None, None) => Value::from(()),
        },
        Json::String(s) => Value::from(s.as_str()),
        Json::Bool(b) => Value::from(*b),
        Json::Null => Value::from(()),
    }
}

/// Python's `repr(x)` where it has an exponent (where minijinja's positional text differs).
fn exponent_repr(x: f64) -> Option<String> {
    let text = crate::py_repr::float_repr(x);
    (x.is_finite() && text.contains('e')).then_some(text)
}

/// A float that prints as Python prints it; not a string, mapping or sequence to the template.
#[derive(Debug)]
struct PyFloat(String);

impl Object for PyFloat {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn render(self: &Arc<Self>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        for (x, python) in [(1e-7, Some("1e-07")), (1e20, Some("1e+20")), (-1.5e16, Some("-1.5e+16")), (1.234e-100, Some("1.234e-100"))] {
            assert_eq!(exponent_repr(x).as_deref(), python, "{x}");
        }
        for x in [0.1, 1e15, 1e-4, 2.5, -3.0, 0.0] {
            assert_eq!(exponent_repr(x), None, "{x}: positional in Python too");
        }
    }
}
