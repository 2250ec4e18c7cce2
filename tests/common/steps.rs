//! The steps of the engine-level property test (see `world`) and the shape of its world.

use portcullis::Namespace;
use portcullis::fence::HookPoint;

/// One step of one owner (or of the clock). Entities are numbered; entity `i` lives in
/// namespace `i % namespaces`.
#[derive(Clone, Debug)]
pub enum Step {
    /// Restore an entity (a read that looks at nothing).
    Touch {
        o: usize,
        e: usize,
    },
    /// Read an entity's state and compare it with the fold of its committed log.
    Read {
        o: usize,
        e: usize,
    },
    /// Append one record through the engine.
    Write {
        o: usize,
        e: usize,
    },
    /// Defer one record (SPEC R8).
    Defer {
        o: usize,
        e: usize,
    },
    /// Publish a checkpoint (and truncate, if the owner is configured to).
    Checkpoint {
        o: usize,
        e: usize,
    },
    /// Advance a namespace's epoch by one.
    Bump {
        o: usize,
        ns: usize,
    },
    /// One revocation slice with a small budget.
    Revoke {
        o: usize,
        ns: usize,
        pages: usize,
        pushes: usize,
    },
    /// An application row written through the engine's fence under the owner's grant.
    Renew {
        o: usize,
        e: usize,
    },
    /// An application row written through the engine's fence under the current epoch.
    FenceWrite {
        o: usize,
        e: usize,
    },
    /// One sweep of expired leased-shard rows.
    Sweep {
        o: usize,
        ns: usize,
    },
    /// Advance the store's clock (every owner's moves with it).
    Advance {
        ms: u64,
    },
    /// Set one owner's clock skew against the store's.
    Skew {
        o: usize,
        ms: i64,
    },
    /// Declare a namespace's lease table recovered (SPEC F6).
    MarkRecovered {
        o: usize,
        ns: usize,
    },
    /// The authority fence (SPEC F10): bump, one slice, a write under both fences.
    AuthBump {
        o: usize,
        ns: usize,
    },
    AuthRevoke {
        o: usize,
        ns: usize,
    },
    AuthWrite {
        o: usize,
        e: usize,
        refresh: bool,
    },
    /// The owner's process dies (no clean close) and a new engine with the same owner id opens.
    Crash {
        o: usize,
    },
    /// Release a namespace (a clean hand-over).
    Release {
        o: usize,
        ns: usize,
    },
    /// Adopt a namespace, when no other owner may still write it.
    Own {
        o: usize,
        ns: usize,
    },
    /// Bump, revoke until `Complete` (bounded), adopt.
    TakeOver {
        o: usize,
        ns: usize,
    },
    /// The same in one call, `Engine::take_over` (SPEC F12), forced or not.
    TakeOverCall {
        o: usize,
        ns: usize,
        force: bool,
    },
    /// A warm of every pending entity the owner serves (SPEC R6, F12).
    Warm {
        o: usize,
    },
    /// `fold_all` over what the owner serves (SPEC R7, F12).
    FoldAll {
        o: usize,
    },
    /// The coordinator is restored from an older copy (its leased-shard rows are lost) and
    /// declared recovered at once, as SPEC F6 requires.
    LoseRows {
        o: usize,
        ns: usize,
    },
    /// The answer to owner `o`'s next batch that appends log records is lost
    /// (`OutcomeUnknown`): after it committed (`commit`), or with the batch held in the network,
    /// to arrive at a later [`Step::Deliver`] (a delayed copy, SPEC S2, F12).
    LoseAnswer {
        o: usize,
        commit: bool,
    },
    /// The oldest batch of owner `o` (of any of its incarnations) still in the network arrives
    /// at the store.
    Deliver {
        o: usize,
    },
    /// Run `then`; when owner `o`'s fence reaches `point`, run `actions` (other owners) there.
    Interleave {
        o: usize,
        point: HookPoint,
        actions: Vec<Step>,
        then: Box<Step>,
    },
}

/// Shape of a world.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub owners: usize,
    pub namespaces: usize,
    pub entities: usize,
}

/// Namespace `i` of a world.
pub fn namespace(i: usize) -> Namespace {
    Namespace::new(format!("ns{i}")).unwrap()
}
