//! The cost of the C boundary (SPEC E3; issue goal: a durable write through C within 5% of the
//! same write from Rust): a durable one-record append and a read of the state as bytes, through
//! the exported `pc_engine_*` functions and through `Engine` directly, in the same run.
//!
//! Both engines run the same state machine (a sum of 8-byte records): in Rust as a
//! `StateMachine`, through C as a `pc_machine` whose callbacks are `extern "C"` functions doing
//! the same work. Each engine has its own file store in the system temp directory, with the
//! default sync policy (a write returns once it is on stable storage). The C path pays what a C
//! caller pays: argument checks, building the `EntityId` from the namespace and id, copying
//! the record, the panic catch, and for a read the encode callback and a `pc_bytes` to free.
//!
//! Run: `cargo bench -p portcullis-ffi --bench boundary -- --warm-up-time 1 --measurement-time 5`.
//! After criterion's output it prints medians of the two paths measured interleaved (Rust, C,
//! Rust, C ...), so both see the same disk.

use std::ffi::{CStr, c_void};
use std::time::{Duration, Instant};

use criterion::Criterion;
use portcullis::engine::Engine;
use portcullis::{ApplyContext, EntityId, Rejection, StateMachine};
use portcullis_ffi::engine::{
    pc_engine, pc_engine_append, pc_engine_free, pc_engine_open, pc_engine_read, pc_slice,
};
use portcullis_ffi::machine::{pc_apply_context, pc_entity_view, pc_machine, pc_sink};
use portcullis_ffi::options::{
    PC_REGISTER_ON_FIRST_WRITE, pc_engine_options_directory, pc_engine_options_flag,
    pc_engine_options_free, pc_engine_options_new,
};
use portcullis_ffi::outputs::pc_sink_write;
use portcullis_ffi::{PC_OK, pc_bytes, pc_bytes_free};

const NS: &CStr = c"bench";
const ID: &[u8] = b"acct";

struct Sum;

impl StateMachine for Sum {
    type State = u64;
    fn fresh(&self, _: &EntityId) -> u64 {
        0
    }
    fn apply(&self, s: &mut u64, _: &ApplyContext<'_>, r: &[u8]) -> Result<(), Rejection> {
        let bytes: [u8; 8] = r.try_into().map_err(|_| Rejection::new("not 8 bytes"))?;
        *s += u64::from_le_bytes(bytes);
        Ok(())
    }
    fn encode_checkpoint(&self, s: &u64) -> Result<Vec<u8>, Rejection> {
        Ok(s.to_le_bytes().to_vec())
    }
    fn decode_checkpoint(&self, _: &EntityId, b: &[u8]) -> Result<u64, Rejection> {
        Ok(u64::from_le_bytes(
            b.try_into().map_err(|_| Rejection::new("bad"))?,
        ))
    }
}

unsafe extern "C" fn c_fresh(
    _: *mut c_void,
    _: *const pc_entity_view,
    out: *mut *mut c_void,
) -> u32 {
    // SAFETY: a writable out-pointer.
    unsafe { *out = Box::into_raw(Box::new(0u64)).cast() };
    0
}

unsafe extern "C" fn c_apply(
    _: *mut c_void,
    state: *mut c_void,
    _: *const pc_apply_context,
    record: *const u8,
    len: usize,
) -> u32 {
    if len != 8 {
        return 1;
    }
    // SAFETY: the library passes the state fresh/decode returned and `len` readable bytes.
    unsafe {
        let bytes: [u8; 8] = std::slice::from_raw_parts(record, 8).try_into().unwrap();
        *state.cast::<u64>() += u64::from_le_bytes(bytes);
    }
    0
}

unsafe extern "C" fn c_encode(_: *mut c_void, state: *const c_void, out: *mut pc_sink) -> u32 {
    // SAFETY: a state fresh/decode returned, and the sink of this call.
    unsafe {
        let bytes = (*state.cast::<u64>()).to_le_bytes();
        pc_sink_write(out, bytes.as_ptr(), 8, std::ptr::null_mut())
    }
}

unsafe extern "C" fn c_decode(
    _: *mut c_void,
    _: *const pc_entity_view,
    bytes: *const u8,
    len: usize,
    out: *mut *mut c_void,
) -> u32 {
    if len != 8 {
        return 1;
    }
    // SAFETY: `len` readable bytes and a writable out-pointer.
    unsafe {
        let b: [u8; 8] = std::slice::from_raw_parts(bytes, 8).try_into().unwrap();
        *out = Box::into_raw(Box::new(u64::from_le_bytes(b))).cast();
    }
    0
}

unsafe extern "C" fn c_free(_: *mut c_void, state: *mut c_void) {
    // SAFETY: a state c_fresh/c_decode boxed, freed once.
    drop(unsafe { Box::from_raw(state.cast::<u64>()) });
}

/// The engine through C, and its directory.
struct CSide {
    engine: *mut pc_engine,
    _dir: tempfile::TempDir,
}

impl CSide {
    fn open() -> CSide {
        let dir = tempfile::Builder::new()
            .prefix("portcullis-bench-ffi-c-")
            .tempdir()
            .unwrap();
        let path = std::ffi::CString::new(dir.path().to_str().unwrap()).unwrap();
        let machine = pc_machine {
            struct_size: std::mem::size_of::<pc_machine>(),
            user_data: std::ptr::null_mut(),
            fresh: Some(c_fresh),
            apply: Some(c_apply),
            encode: Some(c_encode),
            decode: Some(c_decode),
            validate: None,
            repair: None,
            free_state: Some(c_free),
            destroy: None,
            check: None,
            version: 0,
            upcast_record: None,
            upcast_checkpoint: None,
        };
        let mut engine = std::ptr::null_mut();
        // SAFETY: valid arguments; the options are freed after the open.
        unsafe {
            let mut options = std::ptr::null_mut();
            let none = std::ptr::null_mut();
            assert_eq!(pc_engine_options_new(&mut options, none), PC_OK);
            assert_eq!(
                pc_engine_options_directory(options, path.as_ptr(), none),
                PC_OK
            );
            assert_eq!(
                pc_engine_options_flag(options, PC_REGISTER_ON_FIRST_WRITE, true, none),
                PC_OK
            );
            assert_eq!(pc_engine_open(options, &machine, &mut engine, none), PC_OK);
            pc_engine_options_free(options);
        }
        CSide { engine, _dir: dir }
    }

    fn append(&self, v: u64) {
        let bytes = v.to_le_bytes();
        let record = pc_slice {
            data: bytes.as_ptr(),
            len: 8,
        };
        let (mut first, mut last) = (0, 0);
        // SAFETY: a live engine and valid buffers.
        let code = unsafe {
            pc_engine_append(
                self.engine,
                NS.as_ptr(),
                ID.as_ptr(),
                ID.len(),
                &record,
                1,
                &mut first,
                &mut last,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(code, PC_OK);
    }

    fn read(&self) -> u64 {
        let mut out = pc_bytes {
            data: std::ptr::null_mut(),
            len: 0,
        };
        // SAFETY: a live engine, valid buffers; the bytes are freed below.
        unsafe {
            assert_eq!(
                pc_engine_read(
                    self.engine,
                    NS.as_ptr(),
                    ID.as_ptr(),
                    ID.len(),
                    &mut out,
                    std::ptr::null_mut()
                ),
                PC_OK
            );
            let v = u64::from_le_bytes(std::slice::from_raw_parts(out.data, 8).try_into().unwrap());
            pc_bytes_free(&mut out);
            v
        }
    }
}

impl Drop for CSide {
    fn drop(&mut self) {
        // SAFETY: the engine this side opened, freed once.
        unsafe { pc_engine_free(self.engine) };
    }
}

struct RustSide {
    engine: Engine<Sum>,
    entity: EntityId,
    _dir: tempfile::TempDir,
}

impl RustSide {
    fn open() -> RustSide {
        let dir = tempfile::Builder::new()
            .prefix("portcullis-bench-ffi-rust-")
            .tempdir()
            .unwrap();
        let engine = Engine::builder(Sum)
            .directory(dir.path())
            .register_on_first_write(true)
            .open()
            .unwrap();
        let entity = EntityId::new("bench", ID).unwrap();
        RustSide {
            engine,
            entity,
            _dir: dir,
        }
    }

    fn append(&self, v: u64) {
        self.engine
            .append(&self.entity, vec![v.to_le_bytes().to_vec()])
            .unwrap();
    }

    fn read(&self) -> u64 {
        // The same work as the C path: the state encoded as bytes.
        let bytes = self
            .engine
            .read(&self.entity, |s| Sum.encode_checkpoint(s))
            .unwrap()
            .unwrap();
        u64::from_le_bytes(bytes.try_into().unwrap())
    }
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn full_run() -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test")
}

fn main() {
    let rust = RustSide::open();
    let c = CSide::open();
    rust.append(1);
    c.append(1);

    let mut criterion = Criterion::default().configure_from_args();
    let mut group = criterion.benchmark_group("boundary");
    group.bench_function("durable_append/rust", |b| b.iter(|| rust.append(1)));
    group.bench_function("durable_append/c", |b| b.iter(|| c.append(1)));
    group.bench_function("read/rust", |b| b.iter(|| rust.read()));
    group.bench_function("read/c", |b| b.iter(|| c.read()));
    group.finish();
    criterion.final_summary();

    // Interleaved, so that both paths see the same disk and the same neighbours.
    let (writes, reads) = if full_run() {
        (2_000, 200_000)
    } else {
        (10, 10)
    };
    let (mut wr, mut wc, mut rr, mut rc) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..writes {
        let t = Instant::now();
        rust.append(1);
        wr.push(t.elapsed());
        let t = Instant::now();
        c.append(1);
        wc.push(t.elapsed());
    }
    for _ in 0..reads {
        let t = Instant::now();
        std::hint::black_box(rust.read());
        rr.push(t.elapsed());
        let t = Instant::now();
        std::hint::black_box(c.read());
        rc.push(t.elapsed());
    }
    let (wr, wc, rr, rc) = (median(wr), median(wc), median(rr), median(rc));
    println!("\ninterleaved medians ({writes} durable appends, {reads} reads per path):");
    println!(
        "  durable append: rust {wr:?}, c {wc:?}, c/rust {:.3}",
        wc.as_secs_f64() / wr.as_secs_f64()
    );
    println!(
        "  read as bytes:  rust {rr:?}, c {rc:?}, c/rust {:.3}",
        rc.as_secs_f64() / rr.as_secs_f64()
    );
}
