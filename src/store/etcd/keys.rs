//! Where the etcd backend keeps things in etcd's flat key space, and base64 for the JSON
//! gateway (SPEC S11).
//!
//! Every key the store writes starts with the store's root prefix, followed by a one-byte tag:
//!
//! ```text
//! root 'd' len name key   a row: len is the partition name's length (one byte, 1..=255)
//! root 'p' name           the partition registry: one key per partition that has committed
//! root 'm' client slot    a commit-marker slot (client and slot: 8 bytes each, big-endian)
//! root 'c'                written once per open: its revision names the client
//! ```
//!
//! A partition's rows live under `root 'd' len name`. Because the name's length comes first,
//! no partition's prefix is a prefix of another's (equal lengths differ in the name, unequal
//! lengths in the length byte), so ranges of one partition never reach into another, for any
//! byte strings. User keys follow the prefix unchanged, so etcd's byte order is the store's
//! key order, and every key round-trips.

use std::ops::Bound;

use crate::store::{KeyRange, Partition};

/// The key layout under one root prefix.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    root: Vec<u8>,
}

impl Layout {
    pub(crate) fn new(root: Vec<u8>) -> Self {
        Layout { root }
    }

    pub(crate) fn root(&self) -> &[u8] {
        &self.root
    }

    fn tagged(&self, tag: u8, extra: usize) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.root.len() + 1 + extra);
        k.extend_from_slice(&self.root);
        k.push(tag);
        k
    }

    /// The prefix of every row of `p`.
    pub(crate) fn data_prefix(&self, p: &Partition) -> Vec<u8> {
        let name = p.as_bytes();
        let mut k = self.tagged(b'd', 1 + name.len());
        // A partition name is 1..=255 bytes (MAX_PARTITION_NAME_BYTES), so it fits a byte.
        k.push(u8::try_from(name.len()).expect("partition names are at most 255 bytes"));
        k.extend_from_slice(name);
        k
    }

    /// The etcd key of row `key` of the partition whose prefix is `prefix`.
    pub(crate) fn data_key(prefix: &[u8], key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(prefix.len() + key.len());
        k.extend_from_slice(prefix);
        k.extend_from_slice(key);
        k
    }

    /// The registry key of `p`.
    pub(crate) fn registry_key(&self, p: &Partition) -> Vec<u8> {
        let mut k = self.tagged(b'p', p.as_bytes().len());
        k.extend_from_slice(p.as_bytes());
        k
    }

    /// The registry's keys for partition names starting with `prefix`: `[start, end)`.
    pub(crate) fn registry_range(&self, prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let mut start = self.tagged(b'p', prefix.len());
        start.extend_from_slice(prefix);
        let end = prefix_end(&start);
        (start, end)
    }

    /// The partition name of a registry key.
    pub(crate) fn registry_name<'k>(&self, key: &'k [u8]) -> Option<&'k [u8]> {
        key.strip_prefix(self.root.as_slice())?.strip_prefix(b"p")
    }

    /// Commit-marker slot `slot` of client `client`.
    pub(crate) fn marker_key(&self, client: u64, slot: u64) -> Vec<u8> {
        let mut k = self.tagged(b'm', 16);
        k.extend_from_slice(&client.to_be_bytes());
        k.extend_from_slice(&slot.to_be_bytes());
        k
    }

    /// The key written at open, whose revision names the client.
    pub(crate) fn client_key(&self) -> Vec<u8> {
        self.tagged(b'c', 0)
    }
}

/// The smallest key above every key that starts with `prefix` (etcd's "prefix end").
///
/// Every prefix built here contains a tag byte below 0xff, so the result is never empty.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while end.last() == Some(&0xff) {
        end.pop();
    }
    match end.last_mut() {
        Some(last) => *last += 1,
        // No upper bound: etcd spells "every key from here on" as a single zero byte.
        None => end.push(0),
    }
    end
}

/// A key range of a partition as etcd's half-open `[key, range_end)` over the partition's
/// prefix, or `None` when no key can lie in it.
pub(crate) fn encode_range(prefix: &[u8], r: &KeyRange) -> Option<(Vec<u8>, Vec<u8>)> {
    if r.is_empty() {
        return None;
    }
    let start = match &r.start {
        Bound::Included(s) => Layout::data_key(prefix, s),
        Bound::Excluded(s) => {
            let mut k = Layout::data_key(prefix, s);
            k.push(0);
            k
        }
        Bound::Unbounded => prefix.to_vec(),
    };
    let end = match &r.end {
        Bound::Excluded(e) => Layout::data_key(prefix, e),
        Bound::Included(e) => {
            let mut k = Layout::data_key(prefix, e);
            k.push(0);
            k
        }
        Bound::Unbounded => prefix_end(prefix),
    };
    (start < end).then_some((start, end))
}

/// The key after `key` in byte order: where a page resumes.
pub(crate) fn successor(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.extend_from_slice(key);
    k.push(0);
    k
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding, as etcd's gateway reads bytes fields.
pub(crate) fn b64(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes standard base64 (padding optional), as etcd's gateway writes bytes fields.
pub(crate) fn unb64(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=').as_bytes();
    if text.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            let v = match c {
                b'A'..=b'Z' => c - b'A',
                b'a'..=b'z' => c - b'a' + 26,
                b'0'..=b'9' => c - b'0' + 52,
                b'+' | b'-' => 62,
                b'/' | b'_' => 63,
                _ => return None,
            };
            n |= u32::from(v) << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_every_length_and_byte() {
        let data: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        for len in 0..data.len() {
            let encoded = b64(&data[..len]);
            assert_eq!(encoded.len() % 4, 0);
            assert_eq!(
                unb64(&encoded).as_deref(),
                Some(&data[..len]),
                "length {len}"
            );
        }
        assert_eq!(b64(b"foobar"), "Zm9vYmFy");
        assert_eq!(b64(b"fo"), "Zm8=");
        assert_eq!(b64(b"f"), "Zg==");
        assert_eq!(unb64("Zm8").as_deref(), Some(&b"fo"[..]));
        assert_eq!(unb64("Z"), None);
        assert_eq!(unb64("Z!=="), None);
    }

    #[test]
    fn partition_prefixes_never_nest() {
        let layout = Layout::new(b"r/".to_vec());
        let names: Vec<Vec<u8>> = vec![
            vec![0],
            vec![0, 0],
            b"a".to_vec(),
            b"ab".to_vec(),
            vec![b'a'; 255],
            vec![0xff; 255],
            vec![1],
            vec![0xff],
        ];
        for a in &names {
            for b in &names {
                let pa = layout.data_prefix(&Partition::new(a).unwrap());
                let pb = layout.data_prefix(&Partition::new(b).unwrap());
                if a != b {
                    assert!(!pb.starts_with(&pa), "{a:?} inside {b:?}");
                }
                // A whole-partition range of a never holds a key of b.
                let (start, end) = encode_range(&pa, &KeyRange::all()).unwrap();
                let kb = Layout::data_key(&pb, &[0xff, 0xff]);
                assert_eq!(a == b, kb >= start && kb < end, "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn ranges_map_every_bound_kind() {
        let prefix = b"Pd\x01x".to_vec();
        let key = |k: &[u8]| Layout::data_key(&prefix, k);
        let r = KeyRange {
            start: Bound::Excluded(b"a".to_vec()),
            end: Bound::Included(b"c".to_vec()),
        };
        let (s, e) = encode_range(&prefix, &r).unwrap();
        for (k, inside) in [
            (&b"a"[..], false),
            (b"a\0", true),
            (b"c", true),
            (b"c\0", false),
        ] {
            assert_eq!(key(k) >= s && key(k) < e, inside, "{k:?}");
        }
        assert_eq!(encode_range(&prefix, &KeyRange::between(b"b", b"b")), None);
        let (s, e) = encode_range(&prefix, &KeyRange::all()).unwrap();
        assert_eq!(s, prefix);
        assert_eq!(e, b"Pd\x01y");
        assert_eq!(prefix_end(&[b'a', 0xff, 0xff]), b"b");
        assert_eq!(prefix_end(&[0xff]), vec![0]);
    }
}
