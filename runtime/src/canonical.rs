//! Canonical JSON: the bytes every digest in the journal is taken over.
//!
//! The bytes depend on the value alone. Object keys are sorted by their UTF-8 bytes while the
//! value is written, not by trusting `serde_json::Map` to be a `BTreeMap`: any crate in an
//! application's dependency graph can turn on `serde_json/preserve_order` (schemars has such a
//! feature), and then the map keeps insertion order. Numbers are written in one form each
//! (integers as decimal digits, other numbers in the shortest form that reads back the same
//! `f64`), whatever `arbitrary_precision` says about how the number was read. Strings are
//! escaped as `serde_json` escapes them, which no feature changes.
//!
//! These are the bytes `serde_json` wrote with neither feature on, so digests recorded before
//! this module existed stay the same.

use serde_json::{Number, Value};

/// The canonical bytes of `value`, shared: written into a buffer this thread keeps, then
/// copied once into their allocation, where a vector of their own would grow to their size in
/// steps. A payload larger than the buffer keeps ([`SCRATCH_KEPT`]) grows one as before.
pub(crate) fn to_shared(value: &Value) -> std::sync::Arc<[u8]> {
    thread_local! {
        static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
    }
    let mut out = SCRATCH.take();
    out.clear();
    write_value(&mut out, value);
    let shared = std::sync::Arc::from(out.as_slice());
    // A rare large payload does not keep its size for the thread's lifetime.
    if out.capacity() <= SCRATCH_KEPT {
        SCRATCH.set(out);
    }
    shared
}

/// The most a thread's canonical buffer keeps between payloads. Most payloads are far smaller,
/// and every thread that encodes one keeps a buffer: the blocking pool's hundreds of threads
/// included.
const SCRATCH_KEPT: usize = 16 * 1024;

/// The canonical bytes of the string `text`.
pub(crate) fn string(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 2);
    write_string(&mut out, text);
    out
}

/// The canonical bytes of an object whose values are canonical bytes already (a payload's),
/// without decoding them into a `Value` first: what [`to_shared`] writes for that object.
pub(crate) fn object_of_canonical(fields: &mut [(&str, &[u8])]) -> Vec<u8> {
    fields.sort_unstable_by(|(a, _), (b, _)| a.as_bytes().cmp(b.as_bytes()));
    let size: usize = fields.iter().map(|(k, v)| k.len() + v.len() + 4).sum();
    let mut out = Vec::with_capacity(size + 2);
    out.push(b'{');
    for (index, (key, value)) in fields.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        write_string(&mut out, key);
        out.push(b':');
        out.extend_from_slice(value);
    }
    out.push(b'}');
    out
}

fn write_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(number) => write_number(out, number),
        Value::String(text) => write_string(out, text),
        Value::Array(items) => {
            out.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_value(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut fields: Vec<(&String, &Value)> = map.iter().collect();
            fields.sort_unstable_by(|(a, _), (b, _)| a.as_bytes().cmp(b.as_bytes()));
            out.push(b'{');
            for (index, (key, item)) in fields.into_iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_string(out, key);
                out.push(b':');
                write_value(out, item);
            }
            out.push(b'}');
        }
    }
}

fn write_number(out: &mut Vec<u8>, number: &Number) {
    // An integer's decimal digits, written in place: `to_string` made a `String` for each,
    // and a step encodes two payloads (its input and its output).
    if let Some(unsigned) = number.as_u64() {
        write_json(out, &unsigned);
    } else if let Some(signed) = number.as_i64() {
        write_json(out, &signed);
    } else {
        // Beyond 64-bit integers (only readable with `arbitrary_precision`), a number is the
        // nearest `f64`; serializing an `f64` always uses the shortest round-trip form.
        let float = number.as_f64().unwrap_or(0.0);
        write_json(out, &float);
    }
}

fn write_string(out: &mut Vec<u8>, text: &str) {
    write_json(out, text);
}

fn write_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Writing a string or a finite float into a Vec cannot fail.
    if serde_json::to_writer(&mut *out, value).is_err() {
        out.extend_from_slice(b"null");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn to_vec(value: &Value) -> Vec<u8> {
        to_shared(value).to_vec()
    }

    #[test]
    fn a_payload_after_a_longer_one_is_its_own_bytes_alone() {
        let long = json!({"text": "x".repeat(100)});
        assert_eq!(to_vec(&long).len(), 111);
        assert_eq!(to_vec(&json!([1, 2])), b"[1,2]");
        let huge = json!("y".repeat(SCRATCH_KEPT * 2));
        assert_eq!(to_vec(&huge).len(), SCRATCH_KEPT * 2 + 2);
        assert_eq!(to_vec(&json!(null)), b"null");
    }

    #[test]
    fn keys_are_sorted_at_every_depth() {
        let value = json!({"z": {"b": 1, "a": [{"y": 2, "x": 1}]}, "a": null});
        assert_eq!(
            to_vec(&value),
            br#"{"a":null,"z":{"a":[{"x":1,"y":2}],"b":1}}"#
        );
    }

    #[test]
    fn numbers_and_strings_have_one_form() {
        let value = json!([
            1,
            -7,
            1.5,
            3.0,
            1e21,
            0.1,
            u64::MAX,
            i64::MIN,
            "a\"\n\u{1}é"
        ]);
        let expected = "[1,-7,1.5,3.0,1e+21,0.1,18446744073709551615,-9223372036854775808,\
                        \"a\\\"\\n\\u0001é\"]";
        assert_eq!(String::from_utf8(to_vec(&value)).unwrap(), expected);
    }

    #[test]
    fn an_object_of_canonical_values_is_the_objects_canonical_bytes() {
        let result = json!({"ref": "B-\"7\"", "legs": [2, 1.5], "at": null});
        let (result_bytes, name) = (to_vec(&result), string("rebook\n"));
        let mut fields = [
            ("result", &result_bytes[..]),
            ("operation", &name[..]),
            ("idempotency_key", b"null".as_slice()),
        ];
        let whole = json!({"operation": "rebook\n", "idempotency_key": null, "result": result});
        assert_eq!(object_of_canonical(&mut fields), to_vec(&whole));
    }

    #[test]
    fn the_bytes_are_what_serde_json_wrote_without_features() {
        let value = json!({"order": "A-1", "n": [1, 2.25, false], "nested": {"k": "v"}});
        let plain = br#"{"n":[1,2.25,false],"nested":{"k":"v"},"order":"A-1"}"#;
        assert_eq!(to_vec(&value), plain);
    }
}
