//! Our own terminal: raw mode (always restored), its size, and a stdin pump.
//!
//! Raw mode is undone by [`RawMode`]'s drop on every normal and error path, and by a
//! panic hook for panics that do not unwind through its owner (a panicking task).

use std::io::{IsTerminal, Read};
use std::sync::{Mutex, Once};

use nix::sys::termios::{self, SetArg, Termios};
use sandbox_protocol::WindowSize;
use tokio::sync::mpsc;

/// Bytes read from stdin per chunk sent to the terminal.
const STDIN_CHUNK_BYTES: usize = 4096;

/// The settings to restore, while raw mode is on.
static SAVED: Mutex<Option<Termios>> = Mutex::new(None);

/// Installs the panic hook once per process.
static HOOK: Once = Once::new();

/// Stdin in raw mode until dropped.
#[derive(Debug)]
pub(crate) struct RawMode {
    _private: (),
}

impl RawMode {
    /// Puts stdin (a terminal) into raw mode.
    pub fn enter() -> nix::Result<Self> {
        let stdin = std::io::stdin();
        let original = termios::tcgetattr(&stdin)?;
        let mut raw = original.clone();
        termios::cfmakeraw(&mut raw);
        *lock_saved() = Some(original);
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore();
                previous(info);
            }));
        });
        if let Err(error) = termios::tcsetattr(&stdin, SetArg::TCSANOW, &raw) {
            lock_saved().take();
            return Err(error);
        }
        Ok(Self { _private: () })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        restore();
    }
}

fn lock_saved() -> std::sync::MutexGuard<'static, Option<Termios>> {
    SAVED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Puts back the saved settings, if raw mode is on.
fn restore() {
    if let Some(original) = lock_saved().take() {
        let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &original);
    }
}

/// True when stdin is a terminal.
pub(crate) fn stdin_is_tty() -> bool {
    std::io::stdin().is_terminal()
}

/// The size of the terminal on stdin, stdout or stderr, whichever is one.
pub(crate) fn window_size() -> Option<WindowSize> {
    for fd in [libc::STDIN_FILENO, libc::STDOUT_FILENO, libc::STDERR_FILENO] {
        let mut size = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which points
        // at a live, writable local of that type; on a non-terminal fd it fails
        // without writing.
        let rc = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut size) };
        if rc == 0 && size.ws_row > 0 && size.ws_col > 0 {
            return Some(WindowSize {
                rows: size.ws_row,
                cols: size.ws_col,
            });
        }
    }
    None
}

/// Reads stdin on a plain thread (a blocking read cannot be cancelled, so it must not
/// hold up the runtime's shutdown) and hands over chunks; the channel closes at end
/// of input.
pub(crate) fn stdin_chunks() -> mpsc::Receiver<std::io::Result<Vec<u8>>> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = vec![0u8; STDIN_CHUNK_BYTES];
        loop {
            let item = match stdin.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => Ok(buf[..n].to_vec()),
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(error) => Err(error),
            };
            let failed = item.is_err();
            if tx.blocking_send(item).is_err() || failed {
                return;
            }
        }
    });
    rx
}
