//! A watchdog for one piece of work: a hang fails the test instead of
//! stalling the suite.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// Runs `work` on its own thread and fails if it has not returned within
/// `limit`: a hang becomes a test failure, not a stuck CI run.
pub fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (done, finished) = mpsc::channel();
    let worker = thread::spawn(move || {
        let result = work();
        let _ = done.send(());
        result
    });
    match finished.recv_timeout(limit) {
        Ok(()) => worker.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // The worker panicked: surface its panic.
            match worker.join() {
                Err(panic) => std::panic::resume_unwind(panic),
                Ok(_) => unreachable!("the worker returned without reporting"),
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what} did not finish within {limit:?}: hung")
        }
    }
}
