//! The atomics of [`crate::sync`] under the feature `simulation`: std's (made outside a
//! simulation) or shuttle's (made inside one, where every access is a scheduling point), with
//! std's API.

use std::fmt;

pub use std::sync::atomic::Ordering;

macro_rules! atomic {
    ($name:ident, $t:ty, [$($op:ident),*]) => {
        /// An atomic with std's API (see the module documentation).
        pub enum $name {
            #[doc(hidden)]
            Real(std::sync::atomic::$name),
            #[doc(hidden)]
            Sim(Box<shuttle::sync::atomic::$name>),
        }

        impl $name {
            /// An atomic holding `v`.
            pub fn new(v: $t) -> Self {
                if super::simulating() {
                    $name::Sim(Box::new(shuttle::sync::atomic::$name::new(v)))
                } else {
                    $name::Real(std::sync::atomic::$name::new(v))
                }
            }

            /// As std's `load`.
            pub fn load(&self, order: Ordering) -> $t {
                match self {
                    $name::Real(a) => a.load(order),
                    $name::Sim(a) => a.load(order),
                }
            }

            /// As std's `store`.
            pub fn store(&self, v: $t, order: Ordering) {
                match self {
                    $name::Real(a) => a.store(v, order),
                    $name::Sim(a) => a.store(v, order),
                }
            }

            /// As std's `swap`.
            pub fn swap(&self, v: $t, order: Ordering) -> $t {
                match self {
                    $name::Real(a) => a.swap(v, order),
                    $name::Sim(a) => a.swap(v, order),
                }
            }

            /// As std's `compare_exchange`.
            pub fn compare_exchange(
                &self,
                current: $t,
                new: $t,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$t, $t> {
                match self {
                    $name::Real(a) => a.compare_exchange(current, new, success, failure),
                    $name::Sim(a) => a.compare_exchange(current, new, success, failure),
                }
            }

            /// As std's `fetch_update`.
            pub fn fetch_update<F>(
                &self,
                set_order: Ordering,
                fetch_order: Ordering,
                f: F,
            ) -> Result<$t, $t>
            where
                F: FnMut($t) -> Option<$t>,
            {
                match self {
                    $name::Real(a) => a.fetch_update(set_order, fetch_order, f),
                    $name::Sim(a) => a.fetch_update(set_order, fetch_order, f),
                }
            }

            /// As std's `get_mut`.
            pub fn get_mut(&mut self) -> &mut $t {
                match self {
                    $name::Real(a) => a.get_mut(),
                    $name::Sim(a) => a.get_mut(),
                }
            }

            /// As std's `into_inner`.
            pub fn into_inner(self) -> $t {
                match self {
                    $name::Real(a) => a.into_inner(),
                    $name::Sim(a) => (*a).into_inner(),
                }
            }

            $(
                /// As std's method of the same name.
                pub fn $op(&self, v: $t, order: Ordering) -> $t {
                    match self {
                        $name::Real(a) => a.$op(v, order),
                        $name::Sim(a) => a.$op(v, order),
                    }
                }
            )*
        }

        impl Default for $name {
            fn default() -> Self {
                $name::new(Default::default())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self {
                    $name::Real(a) => fmt::Debug::fmt(a, f),
                    $name::Sim(_) => f.write_str(concat!(stringify!($name), " { .. }")),
                }
            }
        }

        impl From<$t> for $name {
            fn from(v: $t) -> Self {
                $name::new(v)
            }
        }
    };
}

atomic!(AtomicBool, bool, [fetch_or, fetch_and]);
atomic!(
    AtomicU32,
    u32,
    [fetch_add, fetch_sub, fetch_max, fetch_min, fetch_or]
);
atomic!(
    AtomicU64,
    u64,
    [fetch_add, fetch_sub, fetch_max, fetch_min, fetch_or]
);
atomic!(
    AtomicUsize,
    usize,
    [fetch_add, fetch_sub, fetch_max, fetch_min, fetch_or]
);
