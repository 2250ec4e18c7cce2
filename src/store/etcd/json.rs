//! Request bodies for etcd's JSON gateway, written straight into one buffer (SPEC S11).
//!
//! Owns: the few JSON shapes the backend sends (objects of base64 byte fields, 64-bit numbers
//! as strings, flags), written without an intermediate JSON tree: a commit's body is built in
//! one pass with one allocation. Keys made of several parts (a partition prefix and a user key)
//! are encoded as one base64 string without first being joined.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// A JSON request body under construction.
#[derive(Debug, Default)]
pub(crate) struct Body {
    buf: Vec<u8>,
}

impl Body {
    /// An empty body with room for `capacity` bytes.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Body {
            buf: Vec::with_capacity(capacity),
        }
    }

    /// The bytes written so far.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Appends JSON written by this backend before (a fragment of another body).
    pub(crate) fn append(&mut self, json: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(json);
        self
    }

    /// Appends JSON text as is (structure and field names, written by this backend only).
    pub(crate) fn raw(&mut self, text: &str) -> &mut Self {
        self.buf.extend_from_slice(text.as_bytes());
        self
    }

    /// Appends the concatenation of `parts` as a quoted standard base64 string (with padding),
    /// as the gateway reads `bytes` fields.
    pub(crate) fn bytes(&mut self, parts: &[&[u8]]) -> &mut Self {
        self.buf.push(b'"');
        let total: usize = parts.iter().map(|p| p.len()).sum();
        self.buf.reserve(total.div_ceil(3) * 4 + 1);
        let mut carry = [0u8; 3];
        let mut held = 0;
        for part in parts {
            let mut rest: &[u8] = part;
            if held > 0 {
                let take = (3 - held).min(rest.len());
                carry[held..held + take].copy_from_slice(&rest[..take]);
                held += take;
                rest = &rest[take..];
                if held < 3 {
                    continue;
                }
                self.group(&carry, 3);
            }
            let mut chunks = rest.chunks_exact(3);
            for chunk in &mut chunks {
                self.group(chunk, 3);
            }
            let tail = chunks.remainder();
            carry[..tail.len()].copy_from_slice(tail);
            held = tail.len();
        }
        if held > 0 {
            carry[held..].fill(0);
            self.group(&carry, held);
        }
        self.buf.push(b'"');
        self
    }

    /// Appends `n` as a quoted decimal string, as the gateway reads 64-bit integers.
    pub(crate) fn int(&mut self, n: i64) -> &mut Self {
        self.buf.push(b'"');
        self.buf.extend_from_slice(n.to_string().as_bytes());
        self.buf.push(b'"');
        self
    }

    /// Encodes one group of three bytes of which `len` (1 to 3) are data.
    fn group(&mut self, chunk: &[u8], len: usize) {
        let n = (u32::from(chunk[0]) << 16) | (u32::from(chunk[1]) << 8) | u32::from(chunk[2]);
        for i in 0..4 {
            self.buf.push(if i <= len {
                ALPHABET[(n >> (18 - 6 * i)) as usize & 63]
            } else {
                b'='
            });
        }
    }

    /// The finished body.
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::super::keys::{b64, unb64};
    use super::*;

    #[test]
    fn bytes_of_several_parts_encode_as_their_concatenation() {
        let data: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        for len in [0usize, 1, 2, 3, 4, 5, 7, 100, 511] {
            let whole = &data[..len];
            for a in 0..=len.min(5) {
                for b in a..=len.min(7) {
                    let mut body = Body::default();
                    body.bytes(&[&whole[..a], &whole[a..b], &[], &whole[b..]]);
                    let text = std::str::from_utf8(body.as_bytes()).unwrap();
                    assert_eq!(text, format!("\"{}\"", b64(whole)), "{len} {a} {b}");
                    assert_eq!(unb64(&text[1..text.len() - 1]).as_deref(), Some(whole));
                }
            }
        }
    }

    #[test]
    fn numbers_and_text_are_written_as_is() {
        let mut body = Body::with_capacity(8);
        body.raw("{\"revision\":")
            .int(-5)
            .raw(",\"x\":")
            .int(i64::MAX)
            .raw("}");
        let value: serde_json::Value = serde_json::from_slice(&body.into_bytes()).unwrap();
        assert_eq!(value["revision"], "-5");
        assert_eq!(value["x"], i64::MAX.to_string());
    }
}
