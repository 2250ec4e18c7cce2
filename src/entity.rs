//! Names shared by every layer above the store: namespaces, entity ids, and the partitions
//! they map to.
//!
//! A namespace `ns` has one coordinator partition, `c/<ns>`; an entity `(ns, id)` is the entity
//! partition `e/<ns>/<id>`. Within an entity partition, keys that start with the byte `0x00`
//! are reserved for Portcullis's own rows (log, checkpoint, lease); application rows use any
//! other first byte.

use std::fmt;

use crate::error::{Error, Result};
use crate::store::Partition;

/// The longest namespace name, in bytes.
pub const MAX_NAMESPACE_BYTES: usize = 64;
/// The longest entity id, in bytes.
pub const MAX_ENTITY_ID_BYTES: usize = 128;
/// The first byte of every key Portcullis reserves for itself inside an entity partition.
pub const RESERVED_KEY_PREFIX: u8 = 0x00;

/// A namespace: 1 to 64 bytes of `[a-z0-9._-]`. Entities in a namespace share one epoch.
///
/// ```
/// use portcullis::Namespace;
/// assert!(Namespace::new("chat.v2").is_ok());
/// assert!(Namespace::new("Chat").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace(String);

impl Namespace {
    /// Validates a namespace name.
    pub fn new(name: impl AsRef<str>) -> Result<Self> {
        let name = name.as_ref();
        let valid_chars = name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        });
        if name.is_empty() || name.len() > MAX_NAMESPACE_BYTES || !valid_chars {
            return Err(Error::invalid(format!(
                "a namespace must be 1 to {MAX_NAMESPACE_BYTES} bytes of [a-z0-9._-], got {name:?}"
            )));
        }
        Ok(Namespace(name.to_owned()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The namespace's coordinator partition, `c/<ns>`.
    pub fn coordinator_partition(&self) -> Partition {
        Partition::new(format!("c/{}", self.0)).expect("a valid namespace makes a valid partition")
    }
}

impl fmt::Debug for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Namespace({})", self.0)
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An entity: a namespace and an id of 1 to 128 arbitrary bytes.
///
/// ```
/// use portcullis::EntityId;
/// let e = EntityId::new("chat", "room-7").unwrap();
/// assert_eq!(e.partition().as_bytes(), b"e/chat/room-7");
/// assert_eq!(EntityId::from_partition(&e.partition()), Some(e));
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntityId {
    namespace: Namespace,
    id: Vec<u8>,
}

impl EntityId {
    /// Validates a namespace and an id.
    pub fn new(namespace: impl AsRef<str>, id: impl AsRef<[u8]>) -> Result<Self> {
        let namespace = Namespace::new(namespace)?;
        Self::in_namespace(namespace, id)
    }

    /// An entity in an already validated namespace.
    pub fn in_namespace(namespace: Namespace, id: impl AsRef<[u8]>) -> Result<Self> {
        let id = id.as_ref();
        if id.is_empty() || id.len() > MAX_ENTITY_ID_BYTES {
            return Err(Error::invalid(format!(
                "an entity id must be 1 to {MAX_ENTITY_ID_BYTES} bytes, got {}",
                id.len()
            )));
        }
        Ok(EntityId {
            namespace,
            id: id.to_vec(),
        })
    }

    /// The entity's namespace.
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    /// The entity's id bytes.
    pub fn id(&self) -> &[u8] {
        &self.id
    }

    /// The entity's partition, `e/<ns>/<id>`.
    pub fn partition(&self) -> Partition {
        let mut name = Vec::with_capacity(3 + self.namespace.0.len() + self.id.len());
        name.extend_from_slice(b"e/");
        name.extend_from_slice(self.namespace.0.as_bytes());
        name.push(b'/');
        name.extend_from_slice(&self.id);
        Partition::new(name).expect("a valid entity makes a valid partition")
    }

    /// The entity a partition name belongs to, if it is an entity partition.
    pub fn from_partition(p: &Partition) -> Option<Self> {
        let rest = p.as_bytes().strip_prefix(b"e/")?;
        let slash = rest.iter().position(|&b| b == b'/')?;
        let ns = std::str::from_utf8(&rest[..slash]).ok()?;
        EntityId::new(ns, &rest[slash + 1..]).ok()
    }

    /// The prefix shared by every entity partition of a namespace.
    pub fn partition_prefix(namespace: &Namespace) -> Vec<u8> {
        format!("e/{}/", namespace.0).into_bytes()
    }
}

impl fmt::Debug for EntityId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EntityId({self})")
    }
}

impl fmt::Display for EntityId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.id.escape_ascii())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_rules() {
        assert!(Namespace::new("a").is_ok());
        assert!(Namespace::new("a".repeat(64)).is_ok());
        assert!(Namespace::new("a".repeat(65)).is_err());
        assert!(Namespace::new("").is_err());
        assert!(Namespace::new("a/b").is_err());
        assert!(Namespace::new("é").is_err());
    }

    #[test]
    fn entity_partitions_round_trip() {
        let e = EntityId::new("ns", [0u8, b'/', 255]).unwrap();
        assert_eq!(EntityId::from_partition(&e.partition()), Some(e));
        assert!(EntityId::new("ns", vec![1u8; 129]).is_err());
        assert!(EntityId::new("ns", b"").is_err());
        let c = Namespace::new("ns").unwrap().coordinator_partition();
        assert_eq!(EntityId::from_partition(&c), None);
    }
}
