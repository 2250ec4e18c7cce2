//! What a compiled caller asks the library it was linked or loaded with: the library's version
//! and the ABI version, and a log callback so background failures (a failed sync, a revocation
//! that gave up, a checkpoint that could not be published) are visible to a C host.
//!
//! Owns: the version functions, the log levels and the process-wide log sink.

use std::ffi::{CString, c_char, c_void};
use std::sync::OnceLock;

use parking_lot::RwLock;

use crate::boundary::{boundary, invalid};
use crate::error::pc_error;

/// The ABI version this header describes. A library answers its own with `pc_abi_version()`:
/// a caller compiled against ABI `N` runs with a library whose ABI version is `N` or later
/// (later versions only add functions, constants, and fields at the end of structs that carry
/// a `struct_size`).
pub const PC_ABI_VERSION: u32 = 1;

/// The ABI version of the library (see `PC_ABI_VERSION`).
///
/// Thread safety: any thread.
#[unsafe(no_mangle)]
pub extern "C" fn pc_abi_version() -> u32 {
    PC_ABI_VERSION
}

/// The library's version, `"MAJOR.MINOR.PATCH"`: static, never freed.
///
/// Thread safety: any thread.
#[unsafe(no_mangle)]
pub extern "C" fn pc_version() -> *const c_char {
    static VERSION: OnceLock<CString> = OnceLock::new();
    VERSION
        .get_or_init(|| CString::new(env!("CARGO_PKG_VERSION")).unwrap_or_default())
        .as_ptr()
}

/// A log level (`pc_log_callback`): the family's values do not overlap any other family's.
pub type pc_log_level = u32;
/// Log level: something failed (a background task panicked).
pub const PC_LOG_ERROR: pc_log_level = 0x0701;
/// Log level: a refusal, a containment, a recovery, a background failure.
pub const PC_LOG_WARN: pc_log_level = 0x0702;
/// Log level: lifecycle (open, close, a warm's summary).
pub const PC_LOG_INFO: pc_log_level = 0x0703;
/// Log level: progress.
pub const PC_LOG_DEBUG: pc_log_level = 0x0704;
/// Log level: everything.
pub const PC_LOG_TRACE: pc_log_level = 0x0705;

/// Receives one log line: its level, the module it came from (`target`) and the message, both
/// NUL-terminated UTF-8 borrowed for the call. Runs on any thread, possibly while the library
/// holds internal locks: copy what it needs and return; never call a `pc_*` function from it.
pub type pc_log_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        level: pc_log_level,
        target: *const c_char,
        message: *const c_char,
    ),
>;

struct Sink {
    call: unsafe extern "C" fn(*mut c_void, pc_log_level, *const c_char, *const c_char),
    user_data: usize,
}

/// The process-wide sink, read on every log line (recursively: a line logged while one is
/// being delivered does not wait), replaced under the write lock.
static SINK: RwLock<Option<Sink>> = RwLock::new(None);

struct Forward;

impl log::Log for Forward {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let sink = SINK.read_recursive();
        let Some(sink) = sink.as_ref() else {
            return;
        };
        let level = match record.level() {
            log::Level::Error => PC_LOG_ERROR,
            log::Level::Warn => PC_LOG_WARN,
            log::Level::Info => PC_LOG_INFO,
            log::Level::Debug => PC_LOG_DEBUG,
            log::Level::Trace => PC_LOG_TRACE,
        };
        let text = |s: String| CString::new(s.replace('\0', " ")).unwrap_or_default();
        let target = text(record.target().to_owned());
        let message = text(record.args().to_string());
        // SAFETY: the caller's callback with its user data and two strings valid for the call.
        unsafe {
            (sink.call)(
                sink.user_data as *mut c_void,
                level,
                target.as_ptr(),
                message.as_ptr(),
            );
        }
    }

    fn flush(&self) {}
}

static FORWARD: Forward = Forward;
static INSTALLED: OnceLock<bool> = OnceLock::new();

/// Sends the library's log lines at `max_level` and above (`PC_LOG_ERROR` ... `PC_LOG_TRACE`)
/// to `callback` with `user_data`, process-wide; a null `callback` stops sending. When this
/// returns, the previous callback is no longer running and is never called again, so its
/// `user_data` may be freed.
///
/// Answers `PC_UNAVAILABLE` when the process already has another logger for the Rust `log`
/// facade (a Rust host that installed its own): the lines go there. `PC_INVALID_ARGUMENT` for
/// a level outside the family.
///
/// # Safety
/// `callback` null or callable from any thread as documented at `pc_log_fn`.
/// Thread safety: any thread, but not from the callback itself.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_log_callback(
    callback: pc_log_fn,
    user_data: *mut c_void,
    max_level: pc_log_level,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        let filter = match max_level {
            PC_LOG_ERROR => log::LevelFilter::Error,
            PC_LOG_WARN => log::LevelFilter::Warn,
            PC_LOG_INFO => log::LevelFilter::Info,
            PC_LOG_DEBUG => log::LevelFilter::Debug,
            PC_LOG_TRACE => log::LevelFilter::Trace,
            other => {
                return Err(invalid(
                    "max_level",
                    &format!("{other:#x} is not a PC_LOG_* level"),
                ));
            }
        };
        let Some(call) = callback else {
            *SINK.write() = None;
            return Ok(());
        };
        if !*INSTALLED.get_or_init(|| log::set_logger(&FORWARD).is_ok()) {
            return Err(portcullis::Error::Unavailable {
                reason: "the process already has a logger for the Rust `log` facade; the \
                         library's lines go there"
                    .to_owned(),
                retry_after_ms: 0,
            });
        }
        *SINK.write() = Some(Sink {
            call,
            user_data: user_data as usize,
        });
        log::set_max_level(filter);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    /// The shared library's soname (set by `build.rs`) follows the ABI version.
    #[test]
    fn the_soname_follows_the_abi_version() {
        assert_eq!(
            env!("PORTCULLIS_SONAME_ABI"),
            super::PC_ABI_VERSION.to_string()
        );
    }
}
