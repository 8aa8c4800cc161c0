//! The thread that does the machine-wide blocking work of `resumed` and
//! `reidentify` (the clock, the random pool, `/etc/machine-id`, the hostname).
//!
//! It is started with the agent and never ends, so it exists in every snapshot. A
//! restored child's first requests are exactly these two, and under TCG each thread
//! tokio's blocking pool had to create for them (its idle threads are gone ten
//! seconds after their last job, so a snapshot of an idle guest has none) cost the
//! child about 5 ms of its single vCPU: a fork's identity step took a median 61.5 ms
//! from a checkpoint without pool threads and 51.5 ms from one with them (6 children
//! each, 2 cores).

use std::panic::AssertUnwindSafe;

use tokio::sync::mpsc;

use sandbox_protocol::{ErrorKind, WireError};

/// Its stack: the jobs are a few system calls and a small file write.
const STACK_BYTES: usize = 256 * 1024;

type Job = Box<dyn FnOnce() + Send>;

/// A handle on the thread; jobs run one at a time, in order.
#[derive(Debug)]
pub struct MachineWorker {
    jobs: mpsc::UnboundedSender<Job>,
}

impl MachineWorker {
    /// Starts the thread.
    pub fn start() -> std::io::Result<Self> {
        // tokio's channel, already in the binary (std's would add about 40 KB).
        let (jobs, mut queue) = mpsc::unbounded_channel::<Job>();
        std::thread::Builder::new()
            .name("machine".to_owned())
            .stack_size(STACK_BYTES)
            .spawn(move || {
                while let Some(job) = queue.blocking_recv() {
                    // A panicking job drops its reply sender (the request gets an
                    // error); the thread serves the next one.
                    let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
                }
            })?;
        Ok(Self { jobs })
    }

    /// Runs `work` on the thread and waits for its result.
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, WireError> {
        let (reply, result) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = reply.send(work());
        });
        self.jobs
            .send(job)
            .map_err(|_| WireError::new(ErrorKind::Internal, "the machine thread is gone"))?;
        result
            .await
            .map_err(|_| WireError::new(ErrorKind::Internal, "the machine job panicked"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_on_one_thread_and_a_panic_does_not_end_it() {
        let worker = MachineWorker::start().unwrap_or_else(|error| panic!("{error}"));
        let first = worker.run(|| std::thread::current().id()).await;
        let panicked = worker.run(|| -> u8 { panic!("a job that panics") }).await;
        let second = worker.run(|| std::thread::current().id()).await;
        assert!(panicked.is_err(), "{panicked:?}");
        let (first, second) = (first.ok(), second.ok());
        assert!(first.is_some());
        assert_eq!(first, second, "one thread, still serving after the panic");
        assert_ne!(first, Some(std::thread::current().id()));
    }
}
