//! Named reasons an entity is contained (SPEC R4, R5).

use std::fmt;

use crate::entity::EntityId;
use crate::error::Error;

/// Which step of the restore unit refused, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReasonKind {
    /// The store failed to read or write.
    Io,
    /// A log record (or another Portcullis row) failed verification.
    CorruptRecord,
    /// The checkpoint does not match the history it claims to fold (SPEC L4).
    CorruptCheckpoint,
    /// The application could not decode its checkpoint.
    Decode,
    /// The application's `apply` refused a record that is in the history (replayed, or
    /// appended after `check` accepted it): the code and the history disagree, a bug or a
    /// record type that changed, never a business refusal, which belongs in `check` (SPEC R12).
    ApplyRefusal,
    /// The application's repair refused.
    RepairRefusal,
    /// Code inside the unit panicked.
    Panic,
    /// The engine could not tell whether the entity was restored or contained (SPEC R5).
    FailClosed,
}

impl ReasonKind {
    /// A stable, short name that starts every reason message.
    pub fn name(self) -> &'static str {
        match self {
            ReasonKind::Io => "io-error",
            ReasonKind::CorruptRecord => "corrupt-record",
            ReasonKind::CorruptCheckpoint => "corrupt-checkpoint",
            ReasonKind::Decode => "decode-error",
            ReasonKind::ApplyRefusal => "apply-refusal",
            ReasonKind::RepairRefusal => "repair-refusal",
            ReasonKind::Panic => "panic",
            ReasonKind::FailClosed => "fail-closed",
        }
    }
}

/// Why an entity is contained: a kind and the detail.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Containment {
    /// The step and way it failed.
    pub kind: ReasonKind,
    /// What was found.
    pub detail: String,
}

impl Containment {
    /// A containment reason.
    pub fn new(kind: ReasonKind, detail: impl Into<String>) -> Self {
        Containment {
            kind,
            detail: detail.into(),
        }
    }

    /// The refusal every toucher of `entity` gets.
    pub fn to_error(&self, entity: &EntityId) -> Error {
        Error::Contained {
            entity: entity.to_string(),
            reason: self.to_string(),
        }
    }

    /// Classifies an error met while loading or replaying history.
    pub(crate) fn from_store_error(error: &Error, checkpoint_step: bool) -> Self {
        let kind = match error {
            Error::Corrupt { .. } if checkpoint_step => ReasonKind::CorruptCheckpoint,
            Error::Corrupt { .. } | Error::UnsupportedVersion { .. } => ReasonKind::CorruptRecord,
            _ => ReasonKind::Io,
        };
        Containment::new(kind, error.to_string())
    }

    /// The reason for a caught panic, with its message when it carried one.
    pub(crate) fn from_panic(step: &str, payload: &(dyn std::any::Any + Send)) -> Self {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_owned());
        Containment::new(ReasonKind::Panic, format!("during {step}: {message}"))
    }
}

impl fmt::Display for Containment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.name(), self.detail)
    }
}
