//! How [`Typed`] encodes records and checkpoints (SPEC E6, E7): postcard ([`encode`],
//! [`decode`]) behind the version envelope it puts in front of every record and checkpoint it
//! writes, and reading an older version through the machine's upcast hooks.
//!
//! Owns: the postcard helpers, the envelope's format ([`encode_versioned`], [`split_version`],
//! [`Versioned`]), the rule that recognises bytes written without an envelope, and [`Typed`]'s
//! record and state codecs ([`Typed::encode_record`], [`Typed::decode_record`]), which the rest
//! of the `typed` module calls. It calls only postcard and [`TypedMachine`]'s hooks.
//! docs/SCHEMA.md has the rules for applications.
//!
//! # The envelope
//!
//! The version, in 7-bit groups from the lowest, each group in one byte with its top bit set,
//! then one zero byte; then the postcard encoding. Version 1 is `0x81 0x00`, version 2 is
//! `0x82 0x00`, version 300 is `0xac 0x82 0x00`: two bytes below version 128.
//!
//! Bytes are enveloped when they start with one to five bytes of 0x80 or more followed by a
//! zero byte. Anything else carries no envelope and is **version 1**: what [`Typed`] wrote
//! before versions existed, read exactly as a version 1 envelope would be.
//!
//! Why postcard bytes written without an envelope are not taken for one: postcard writes every
//! integer of 16 bits or more, every enum variant and every length as a varint of the shortest
//! form, and the last byte of a varint longer than one byte is never zero; `bool` and `Option`
//! start with 0 or 1. So a record or state starts like an envelope only if its encoding
//! starts with a single-byte value (a `u8`, an `i8`, a byte array, a float's lowest byte) of
//! 0x80 or more, followed by a zero byte after any more such bytes. Types that start with a
//! string, an enum, a sequence, a wider integer, a `bool` or an `Option` are never misread.

use std::cmp::Ordering;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Typed, TypedMachine};
use crate::error::{Error, Result};
use crate::restore::Rejection;

/// Encodes a value with postcard, without a version envelope: the bytes an upcast hook
/// decodes, and what [`Typed`] stored before versions existed (such bytes are read as version
/// 1). [`Typed`] writes [`encode_versioned`]`(T::VERSION, value)`.
///
/// Fails with [`Error::InvalidArgument`] if serde refuses the value (for example a map with
/// non-string keys in a format that needs them); nothing is written then.
///
/// ```
/// let bytes = portcullis::typed::encode(&("hello", 7u8)).unwrap();
/// let back: (String, u8) = portcullis::typed::decode(&bytes).unwrap();
/// assert_eq!(back, ("hello".to_string(), 7));
/// ```
pub fn encode<R: Serialize + ?Sized>(value: &R) -> Result<Vec<u8>> {
    postcard::to_stdvec(value)
        .map_err(|e| Error::invalid(format!("the record does not encode with postcard: {e}")))
}

/// Decodes what [`encode`] produced. Trailing bytes are refused, so a record of another type
/// that happens to share a prefix is not silently misread.
///
/// ```
/// let refused = portcullis::typed::decode::<u64>(&[0xff]);
/// assert!(refused.is_err());
/// ```
pub fn decode<R: DeserializeOwned>(bytes: &[u8]) -> Result<R, Rejection> {
    match postcard::take_from_bytes(bytes) {
        Ok((value, [])) => Ok(value),
        Ok((_, rest)) => Err(Rejection::new(format!(
            "{} trailing bytes after the {}",
            rest.len(),
            std::any::type_name::<R>()
        ))),
        Err(e) => Err(Rejection::new(format!(
            "does not decode as {}: {e}",
            std::any::type_name::<R>()
        ))),
    }
}

pub(super) fn encode_all<T: TypedMachine>(records: &[T::Record]) -> Result<Vec<Vec<u8>>> {
    records
        .iter()
        .map(|r| encode_versioned(T::VERSION, r))
        .collect()
}

/// The version of bytes that carry no envelope: [`Typed`] wrote records and checkpoints
/// without one before versions existed.
pub const UNENVELOPED_VERSION: u32 = 1;

/// The most bytes an envelope takes: five 7-bit groups (a `u32`) and the closing zero byte.
const MAX_HEADER: usize = 6;

/// Bytes split into their version and the encoding that follows the envelope.
///
/// ```
/// use portcullis::typed::{encode_versioned, split_version};
/// let bytes = encode_versioned(2, &"hi").unwrap();
/// let split = split_version(&bytes).unwrap();
/// assert_eq!((split.version, split.enveloped), (2, true));
/// assert_eq!(split.payload, portcullis::typed::encode(&"hi").unwrap());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Versioned<'a> {
    /// The version the bytes were written in ([`UNENVELOPED_VERSION`] without an envelope).
    pub version: u32,
    /// The encoding after the envelope (all of the bytes when there is none).
    pub payload: &'a [u8],
    /// Whether the bytes carry an envelope.
    pub enveloped: bool,
}

/// Appends the envelope of `version` to `out`.
fn put_header(version: u32, out: &mut Vec<u8>) {
    let mut rest = version;
    loop {
        // Truncation intended: the low 7 bits.
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
        if rest == 0 {
            break;
        }
    }
    out.push(0);
}

/// Encodes `value` with postcard behind the envelope of `version` (at least 1), as [`Typed`]
/// writes a record or checkpoint of that version. Bytes made this way can be written through
/// the raw calls ([`Engine::append`](crate::Engine::append)) of an engine over a [`Typed`]
/// machine.
///
/// # Errors
/// [`Error::InvalidArgument`] if `version` is 0 or serde refuses the value.
///
/// ```
/// let bytes = portcullis::typed::encode_versioned(1, &7u32).unwrap();
/// assert_eq!(bytes, [0x81, 0x00, 7]);
/// assert!(portcullis::typed::encode_versioned(0, &7u32).is_err());
/// ```
pub fn encode_versioned<R: Serialize + ?Sized>(version: u32, value: &R) -> Result<Vec<u8>> {
    if version == 0 {
        return Err(Error::invalid(
            "version 0 is not a version: versions start at 1",
        ));
    }
    let mut out = Vec::with_capacity(16);
    put_header(version, &mut out);
    postcard::to_extend(value, out)
        .map_err(|e| Error::invalid(format!("the value does not encode with postcard: {e}")))
}

/// Reads the version of bytes a [`Typed`] machine stored: the envelope's, or
/// [`UNENVELOPED_VERSION`] for bytes written without one (see docs/SCHEMA.md for the rule).
///
/// # Errors
/// A [`Rejection`] if the envelope names version 0 or a version beyond `u32`: no code writes
/// those.
///
/// ```
/// use portcullis::typed::split_version;
/// let old = portcullis::typed::encode(&"written before versions").unwrap();
/// let split = split_version(&old).unwrap();
/// assert_eq!((split.version, split.enveloped, split.payload), (1, false, &old[..]));
/// assert!(split_version(&[0x80, 0x00]).is_err()); // version 0
/// ```
pub fn split_version(bytes: &[u8]) -> Result<Versioned<'_>, Rejection> {
    let mut version = 0u64;
    for (i, &byte) in bytes.iter().take(MAX_HEADER).enumerate() {
        if byte & 0x80 == 0 {
            if i == 0 || byte != 0 {
                break;
            }
            let version = u32::try_from(version)
                .ok()
                .filter(|v| *v > 0)
                .ok_or_else(|| {
                    Rejection::new(format!(
                        "its version envelope names version {version}, which no code writes"
                    ))
                })?;
            return Ok(Versioned {
                version,
                payload: &bytes[i + 1..],
                enveloped: true,
            });
        }
        version |= u64::from(byte & 0x7f) << (7 * i);
    }
    Ok(Versioned {
        version: UNENVELOPED_VERSION,
        payload: bytes,
        enveloped: false,
    })
}

/// Decodes versioned bytes as a `V` of version `current`: bytes of that version directly,
/// older ones through `upcast`, newer ones refused. `what` names them in a refusal.
fn decode_at<V: DeserializeOwned>(
    what: &str,
    current: u32,
    bytes: &[u8],
    upcast: impl FnOnce(u32, &[u8]) -> Result<V, Rejection>,
) -> Result<V, Rejection> {
    let split = split_version(bytes).map_err(|r| Rejection::new(format!("the {what}: {r}")))?;
    match split.version.cmp(&current) {
        Ordering::Equal => decode(split.payload).map_err(|r| {
            Rejection::new(format!(
                "the {what} of version {} (this code's) {r}",
                split.version
            ))
        }),
        Ordering::Less => upcast(split.version, split.payload),
        Ordering::Greater => Err(Rejection::new(format!(
            "the {what} was written by version {}, newer than this code's version {current}: \
             only code that knows version {} reads it",
            split.version, split.version
        ))),
    }
}

/// The refusal of [`TypedMachine`]'s default upcast hooks.
pub(super) fn no_upcast(what: &str, hook: &str, version: u32, current: u32) -> Rejection {
    Rejection::new(format!(
        "the {what} was written by version {version} and this code is version {current}: \
         its TypedMachine::{hook} does not bring version {version} up (docs/SCHEMA.md)"
    ))
}

impl<T: TypedMachine> Typed<T> {
    /// A record as this machine writes it: the envelope of [`TypedMachine::VERSION`], then
    /// postcard.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if serde refuses the record.
    ///
    /// ```
    /// use portcullis::typed::{Typed, TypedMachine};
    /// use portcullis::{ApplyContext, EntityId, Rejection};
    ///
    /// struct Sum;
    /// impl TypedMachine for Sum {
    ///     type Record = u32;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, s: &mut u64, _: &ApplyContext<'_>, n: u32) -> Result<(), Rejection> {
    ///         *s += u64::from(n);
    ///         Ok(())
    ///     }
    /// }
    /// assert_eq!(Typed(Sum).encode_record(&5).unwrap(), [0x81, 0x00, 5]);
    /// ```
    pub fn encode_record(&self, record: &T::Record) -> Result<Vec<u8>> {
        const { assert!(T::VERSION > 0, "TypedMachine::VERSION starts at 1") };
        encode_versioned(T::VERSION, record)
    }

    /// Reads a stored record: one of the current version is decoded, an older one (or one
    /// written without an envelope, version 1) goes through
    /// [`TypedMachine::upcast_record`], and a newer one is refused. Never guesses.
    ///
    /// # Errors
    /// A [`Rejection`] naming the versions when the record cannot be read.
    ///
    /// ```
    /// use portcullis::typed::{Typed, TypedMachine, encode_versioned};
    /// use portcullis::{ApplyContext, EntityId, Rejection};
    ///
    /// struct Sum;
    /// impl TypedMachine for Sum {
    ///     type Record = u32;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, s: &mut u64, _: &ApplyContext<'_>, n: u32) -> Result<(), Rejection> {
    ///         *s += u64::from(n);
    ///         Ok(())
    ///     }
    /// }
    /// let sum = Typed(Sum);
    /// assert_eq!(sum.decode_record(&[0x81, 0x00, 5]).unwrap(), 5);
    /// assert_eq!(sum.decode_record(&[5]).unwrap(), 5); // no envelope: version 1
    /// let newer = encode_versioned(2, &5u32).unwrap();
    /// assert!(sum.decode_record(&newer).unwrap_err().reason.contains("version 2"));
    /// ```
    pub fn decode_record(&self, bytes: &[u8]) -> Result<T::Record, Rejection> {
        decode_at("record", T::VERSION, bytes, |version, payload| {
            self.0.upcast_record(version, payload)
        })
    }

    /// A state as a checkpoint of this machine stores it.
    pub(super) fn encode_state(&self, state: &T::State) -> Result<Vec<u8>> {
        const { assert!(T::VERSION > 0, "TypedMachine::VERSION starts at 1") };
        encode_versioned(T::VERSION, state)
    }

    /// Reads a checkpoint's state, as [`decode_record`](Self::decode_record) reads a record,
    /// through [`TypedMachine::upcast_checkpoint`] for older versions.
    pub(super) fn decode_state(&self, bytes: &[u8]) -> Result<T::State, Rejection> {
        decode_at("checkpoint", T::VERSION, bytes, |version, payload| {
            self.0.upcast_checkpoint(version, payload)
        })
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;

    #[test]
    fn e7_the_envelope_is_two_bytes_below_version_128_and_splits_back() {
        for (version, header) in [
            (1u32, vec![0x81, 0x00]),
            (2, vec![0x82, 0x00]),
            (127, vec![0xff, 0x00]),
            (128, vec![0x80, 0x81, 0x00]),
            (300, vec![0xac, 0x82, 0x00]),
            (u32::MAX, vec![0xff, 0xff, 0xff, 0xff, 0x8f, 0x00]),
        ] {
            let bytes = encode_versioned(version, &(7u8, "x")).unwrap();
            assert_eq!(&bytes[..header.len()], header, "version {version}");
            let split = split_version(&bytes).unwrap();
            assert_eq!(split.version, version);
            assert!(split.enveloped);
            assert_eq!(split.payload, postcard::to_stdvec(&(7u8, "x")).unwrap());
        }
    }

    #[test]
    fn e7_envelopes_no_code_writes_are_refused() {
        assert!(split_version(&[0x80, 0x00]).is_err());
        // Five groups beyond u32::MAX.
        assert!(split_version(&[0xff, 0xff, 0xff, 0xff, 0x9f, 0x00]).is_err());
        // Six bytes of 0x80 or more are no envelope: the bytes are unversioned.
        let long = [0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x00];
        assert!(!split_version(&long).unwrap().enveloped);
    }

    #[derive(Serialize, Deserialize)]
    enum Many {
        A(u64),
        B { text: String, n: i64 },
        C(Vec<u16>),
    }

    #[derive(Serialize, Deserialize)]
    struct Fields {
        name: String,
        at: u64,
        flag: bool,
        maybe: Option<u32>,
    }

    /// Postcard bytes of types that start with a varint, a bool or an Option are never taken
    /// for an envelope, whatever the values: the values that put a byte of 0x80 or more first
    /// (lengths and integers of 128 and up, on every boundary of 7-bit groups) included.
    #[test]
    fn e7_unenveloped_postcard_of_varint_led_types_is_never_taken_for_an_envelope() {
        let mut values = vec![0u64, 1, 127, 128, 129, 255, 256, 16_383, 16_384, u64::MAX];
        for shift in 7..64 {
            values.extend([(1u64 << shift) - 1, 1 << shift, (1 << shift) + 1]);
        }
        let mut checked = 0;
        for &n in &values {
            let text = "y".repeat((n % 700) as usize);
            let encodings = [
                postcard::to_stdvec(&n).unwrap(),
                postcard::to_stdvec(&(n as i64)).unwrap(),
                postcard::to_stdvec(&(n as u32)).unwrap(),
                postcard::to_stdvec(&(n as u16)).unwrap(),
                postcard::to_stdvec(&text).unwrap(),
                postcard::to_stdvec(&vec![n as u8; (n % 300) as usize]).unwrap(),
                postcard::to_stdvec(&Many::A(n)).unwrap(),
                postcard::to_stdvec(&Many::B {
                    text: text.clone(),
                    n: (n as i64).wrapping_neg(),
                })
                .unwrap(),
                postcard::to_stdvec(&Many::C(vec![n as u16; 3])).unwrap(),
                postcard::to_stdvec(&Fields {
                    name: text.clone(),
                    at: n,
                    flag: n % 2 == 0,
                    maybe: Some(n as u32),
                })
                .unwrap(),
                postcard::to_stdvec(&Some(n)).unwrap(),
                postcard::to_stdvec(&(n % 2 == 0, n)).unwrap(),
            ];
            for bytes in encodings {
                let split = split_version(&bytes).unwrap();
                assert!(!split.enveloped, "{bytes:02x?} taken for an envelope");
                assert_eq!(split.payload, &bytes[..]);
                checked += 1;
            }
        }
        assert!(checked > 1_000);
    }

    /// The documented exception: a type whose encoding starts with a single-byte value of
    /// 0x80 or more, followed by a zero byte, looks enveloped (docs/SCHEMA.md says so).
    #[test]
    fn e7_a_leading_byte_value_followed_by_zero_is_the_documented_exception() {
        let bytes = postcard::to_stdvec(&(0x81u8, 0u32)).unwrap();
        assert_eq!(bytes, [0x81, 0x00]);
        assert!(split_version(&bytes).unwrap().enveloped);
        let safe = postcard::to_stdvec(&(0x7fu8, 0u32)).unwrap();
        assert!(!split_version(&safe).unwrap().enveloped);
    }
}
