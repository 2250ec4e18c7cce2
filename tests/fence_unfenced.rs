//! Unfenced namespaces (SPEC F11; issue "the engine as a fenced owner", item 3): declared by a
//! durable coordinator row, written with no lease and no leased-shard row, never bumped. On
//! every backend, with pause hooks for the races (never sleeps).

mod fence_support;

use std::sync::Arc;
use std::thread;

use fence_support::*;
use portcullis::fence::{
    Fence, FenceGrant, FenceKind, HookPoint, RevokeBudget, RevokeProgress, WriteOutcome,
    encode_row, write_under,
};
use portcullis::store::Batch;
use portcullis::{Error, Namespace};

fn put(key: &str) -> Batch {
    Batch::new().put(key.as_bytes().to_vec(), b"v".to_vec())
}

fn committed(outcome: WriteOutcome) {
    assert!(
        matches!(outcome, WriteOutcome::Committed { .. }),
        "{outcome:?}"
    );
}

/// Every leased-shard row of the namespace.
fn shard_rows(env: &Env) -> usize {
    env.store
        .scan(
            &env.ns().coordinator_partition(),
            &env.fence.keys().shard_range(),
            None,
            1_000,
        )
        .unwrap()
        .entries
        .len()
}

#[test]
fn unfenced_writes_take_no_lease_and_leave_no_row() {
    each_backend(|env| {
        let ns = env.ns();
        assert!(!env.fence.is_unfenced(&ns).unwrap());
        env.fence.declare_unfenced(&ns).unwrap();
        env.fence.declare_unfenced(&ns).unwrap(); // again: harmless
        assert!(env.fence.is_unfenced(&ns).unwrap());
        for i in 0..10 {
            let e = env.entity(&format!("e{i}"));
            let before = env.fence.stats();
            assert_eq!(
                env.fence.write(&e, 0, put("k")).unwrap(),
                WriteOutcome::Committed { epochs: vec![0] }
            );
            let after = env.fence.stats();
            assert_eq!(
                after.store_calls - before.store_calls,
                1,
                "one apply, no reads"
            );
            assert_eq!(after.renewals, 0);
            assert!(env.lease(&e).is_none(), "no lease");
            assert_eq!(
                env.store.get(&e.partition(), b"k").unwrap(),
                Some(b"v".to_vec())
            );
        }
        assert_eq!(shard_rows(env), 0, "no leased-shard rows");
        // The caller's own guards still decide.
        let e = env.entity("e0");
        let refused = Batch::new()
            .absent(b"k".to_vec())
            .put(b"k".to_vec(), b"w".to_vec());
        assert_eq!(
            env.fence.write(&e, 0, refused).unwrap(),
            WriteOutcome::PreconditionFailed { index: 0 }
        );
        // A grant above the namespace's epoch (0 for ever) is a caller error.
        assert!(matches!(
            env.fence.write(&e, 1, put("k")),
            Err(Error::InvalidArgument(_))
        ));
        // Revocation has nothing to do.
        assert_eq!(
            env.fence.revoke_step(&ns, RevokeBudget::default()).unwrap(),
            RevokeProgress::Complete
        );
    });
}

/// Another fence over the same store (another process) learns the declaration from the store
/// on its first write to the namespace, then writes with one store call.
#[test]
fn another_fence_learns_the_declaration_from_the_store() {
    each_backend(|env| {
        let ns = env.ns();
        env.fence.declare_unfenced(&ns).unwrap();
        let other = Fence::new(env.store.clone(), Arc::new(env.clock.clone()), env.config);
        let e = env.entity("a");
        let before = other.stats().store_calls;
        committed(other.write(&e, 0, put("k")).unwrap());
        assert_eq!(
            other.stats().store_calls - before,
            3,
            "lease read, coordinator read, apply"
        );
        let before = other.stats().store_calls;
        committed(other.write(&e, 0, put("k2")).unwrap());
        assert_eq!(other.stats().store_calls - before, 1);
        assert!(env.lease(&e).is_none());
        assert_eq!(shard_rows(env), 0);
        // And it refuses a bump without writing anything.
        let snap = snapshot(&*env.store);
        let err = other.bump_epoch(&ns, 1).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert_eq!(snapshot(&*env.store), snap);
    });
}

#[test]
fn a_bump_on_an_unfenced_namespace_is_refused_clearly() {
    each_backend(|env| {
        let ns = env.ns();
        env.fence.declare_unfenced(&ns).unwrap();
        let before = snapshot(&*env.store);
        for result in [
            env.fence.bump_epoch(&ns, 1),
            env.fence.advance_epoch(&ns, 1).map(drop),
        ] {
            let err = result.unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
            assert!(err.to_string().contains("unfenced"), "{err}");
        }
        assert_eq!(snapshot(&*env.store), before);
        assert_eq!(env.fence.current_epoch(&ns).unwrap(), 0);
    });
}

#[test]
fn only_a_namespace_never_bumped_can_be_declared_unfenced() {
    each_backend(|env| {
        let ns = env.ns();
        env.fence.bump_epoch(&ns, 1).unwrap();
        let before = snapshot(&*env.store);
        let err = env.fence.declare_unfenced(&ns).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert!(err.to_string().contains("bumped"), "{err}");
        assert_eq!(snapshot(&*env.store), before);
        assert!(!env.fence.is_unfenced(&ns).unwrap());
        // Another namespace is independent.
        let other = Namespace::new("other").unwrap();
        env.fence.declare_unfenced(&other).unwrap();
        assert!(!env.fence.is_unfenced(&ns).unwrap());
    });
}

/// Each fence kind (SPEC F10) has its own declaration.
#[test]
fn the_declaration_belongs_to_one_fence_kind() {
    each_backend(|env| {
        let ns = env.ns();
        let authority = Fence::with_kind(
            env.store.clone(),
            Arc::new(env.clock.clone()),
            env.config,
            FenceKind::Authority,
        );
        authority.declare_unfenced(&ns).unwrap();
        assert!(!env.fence.is_unfenced(&ns).unwrap());
        let e = env.entity("a");
        let grants = [
            FenceGrant {
                fence: &env.fence,
                grant: 0,
            },
            FenceGrant {
                fence: &authority,
                grant: 0,
            },
        ];
        committed(write_under(&grants, &e, |_| Some(put("k"))).unwrap());
        // The epoch fence leased the entity; the authority fence did not.
        assert!(env.lease(&e).is_some());
        let authority_lease = Fence::with_kind(
            env.store.clone(),
            Arc::new(env.clock.clone()),
            env.config,
            FenceKind::Authority,
        )
        .keys()
        .lease()
        .to_vec();
        assert_eq!(
            env.store.get(&e.partition(), &authority_lease).unwrap(),
            None
        );
        assert!(authority.bump_epoch(&ns, 1).is_err());
        env.fence.bump_epoch(&ns, 1).unwrap();
    });
}

/// A renewal that read the coordinator before the declaration cannot commit its leased-shard
/// row after it: it re-plans, finds the declaration and writes unfenced, leaving no row.
#[test]
fn a_renewal_racing_the_declaration_leaves_no_row() {
    each_backend(|env| {
        let (ns, e) = (env.ns(), env.entity("a"));
        let gate = env.hooks.arm(HookPoint::RenewalBeforeRow);
        let fence = env.fence.clone();
        let e2 = e.clone();
        let racing = thread::spawn(move || fence.write(&e2, 0, put("k")));
        gate.wait_reached();
        let other = Fence::new(env.store.clone(), Arc::new(env.clock.clone()), env.config);
        other.declare_unfenced(&ns).unwrap();
        gate.release();
        committed(racing.join().unwrap().unwrap());
        assert_eq!(
            shard_rows(env),
            0,
            "the row commit failed on the declaration"
        );
        assert!(env.lease(&e).is_none());
        assert_eq!(
            env.store.get(&e.partition(), b"k").unwrap(),
            Some(b"v".to_vec())
        );
        assert!(env.fence.is_unfenced(&ns).unwrap());
    });
}

/// A declaration and a bump racing between read and commit: never both succeed.
#[test]
fn a_declaration_and_a_bump_never_both_succeed() {
    each_backend(|env| {
        let ns = env.ns();
        let coordinator = ns.coordinator_partition();
        let keys = env.fence.keys().clone();

        // A bump lands between the declaration's read and its commit: the declaration is
        // refused on re-read.
        let bump_key = keys.current();
        let once = std::sync::atomic::AtomicBool::new(false);
        let racing = Arc::new(Interposer {
            inner: env.store.clone(),
            before_apply: Box::new(move |s| {
                if !once.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    let b = Batch::new().put(bump_key.clone(), encode_row(&1u64));
                    assert!(s.apply(&coordinator, &b).unwrap().is_committed());
                }
            }),
        });
        let declaring = Fence::new(racing, Arc::new(env.clock.clone()), env.config);
        assert!(matches!(
            declaring.declare_unfenced(&ns),
            Err(Error::InvalidArgument(_))
        ));
        assert!(!env.fence.is_unfenced(&ns).unwrap());
        assert_eq!(env.fence.current_epoch(&ns).unwrap(), 1);

        // A declaration lands between a bump's read and its commit (another namespace, never
        // bumped): the bump is refused on re-read.
        let ns2 = Namespace::new("ns2").unwrap();
        let coordinator2 = ns2.coordinator_partition();
        let marker = keys.unfenced();
        let once = std::sync::atomic::AtomicBool::new(false);
        let racing = Arc::new(Interposer {
            inner: env.store.clone(),
            before_apply: Box::new(move |s| {
                if !once.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    let b = Batch::new().put(marker.clone(), encode_row(&7u64));
                    assert!(s.apply(&coordinator2, &b).unwrap().is_committed());
                }
            }),
        });
        let bumping = Fence::new(racing, Arc::new(env.clock.clone()), env.config);
        let err = bumping.bump_epoch(&ns2, 1).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert_eq!(env.fence.current_epoch(&ns2).unwrap(), 0);
    });
}

/// A leased entity written before the declaration keeps working; its row expires and is swept
/// like any other, and no new row appears.
#[test]
fn leases_taken_before_the_declaration_expire_and_are_swept() {
    each_backend(|env| {
        let (ns, e) = (env.ns(), env.entity("a"));
        committed(env.fence.write(&e, 0, put("k")).unwrap());
        assert_eq!(shard_rows(env), 1);
        env.fence.declare_unfenced(&ns).unwrap();
        committed(env.fence.write(&e, 0, put("k2")).unwrap());
        env.clock.advance(30_000);
        committed(env.fence.write(&e, 0, put("k3")).unwrap());
        assert_eq!(env.fence.sweep_step(&ns).unwrap().deleted, 1);
        assert_eq!(shard_rows(env), 0);
        committed(env.fence.write(&env.entity("b"), 0, put("k")).unwrap());
        assert_eq!(shard_rows(env), 0);
    });
}
