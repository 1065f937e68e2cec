//! "Run rounds until shutdown", the shape of every background loop: run a
//! round, pause as the round asks — or not at all —, stop promptly when
//! shutdown comes. Runtime-agnostic: time passes through [`Wake`].

use std::future::Future;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::outbox::Wake;

/// A [`Wake`] that never wakes early: it sleeps on Tokio's timer (feature
/// `tokio`). The timer of every loop that is not woken by its store.
#[cfg(feature = "tokio")]
#[derive(Debug, Clone, Copy, Default)]
pub struct Polling;

#[cfg(feature = "tokio")]
impl Wake for Polling {
    async fn wait(&mut self, max: Duration) {
        tokio::time::sleep(max).await;
    }
}

/// What a round asks for before the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// Go again at once (after letting other tasks run): there is more work.
    None,
    /// Idle: wait for a wake-up hint, at most this long.
    Woken(Duration),
    /// Back off: sleep this long, whatever hints arrive.
    Sleep(Duration),
}

/// The work of a background loop, one round at a time, run by [`RoundLoop::run`].
///
/// The round's future need not be `Send`; [`RoundLoop::run`] is `Send` when
/// it is (the loop can then be spawned on a multi-threaded runtime).
pub trait Rounds {
    /// Does one round's work and says how long to pause before the next.
    fn round(&mut self) -> impl Future<Output = Pause>;
}

/// Runs [`Rounds`] until shutdown.
///
/// Pauses go through `timer`, a [`Wake`] that only sleeps; a
/// [`Pause::Woken`] goes through the hint source given with
/// [`RoundLoop::woken_by`] (without one, the timer). Shutdown is checked
/// first at every pause; by default a round in progress finishes, and with
/// [`RoundLoop::interrupting`] shutdown drops it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// use idem_core::outbox::Wake;
/// use idem_core::{Pause, RoundLoop, Rounds};
///
/// struct Sleep;
/// impl Wake for Sleep {
///     async fn wait(&mut self, max: Duration) { tokio::time::sleep(max).await }
/// }
/// struct Count(u32);
/// impl Rounds for Count {
///     async fn round(&mut self) -> Pause {
///         self.0 += 1;
///         Pause::Sleep(Duration::from_millis(1))
///     }
/// }
///
/// let mut count = Count(0);
/// let shutdown = tokio::time::sleep(Duration::from_millis(50));
/// RoundLoop::new(Sleep).run(&mut count, shutdown).await;
/// assert!(count.0 > 1);
/// # }
/// ```
#[derive(Debug)]
pub struct RoundLoop<T, W = T> {
    timer: T,
    wake: Option<W>,
    interrupt: bool,
}

impl<T: Wake> RoundLoop<T> {
    /// A loop paced by `timer`; a round in progress finishes at shutdown.
    pub fn new(timer: T) -> Self {
        Self {
            timer,
            wake: None,
            interrupt: false,
        }
    }
}

impl<T: Wake, W: Wake> RoundLoop<T, W> {
    /// Waits of [`Pause::Woken`] end early on a hint from `wake` (an
    /// outbox listener, say).
    pub fn woken_by<W2: Wake>(self, wake: W2) -> RoundLoop<T, W2> {
        RoundLoop {
            timer: self.timer,
            wake: Some(wake),
            interrupt: self.interrupt,
        }
    }

    /// Shutdown also interrupts a round in progress, dropping its future:
    /// for rounds that wait (a fetch that waits for messages) and are cancel
    /// safe.
    pub fn interrupting(mut self) -> Self {
        self.interrupt = true;
        self
    }

    /// Runs `round` until `shutdown` completes.
    ///
    /// # Cancel safety
    /// As cancel safe as the round: dropping this future drops the round in
    /// progress, if any.
    pub async fn run<R: Rounds>(mut self, round: &mut R, shutdown: impl Future<Output = ()>) {
        let mut shutdown = pin!(shutdown);
        loop {
            let pause = if self.interrupt {
                let next = round.round();
                let mut next = pin!(next);
                match first(shutdown.as_mut(), next.as_mut()).await {
                    Either::Left(()) => return,
                    Either::Right(pause) => pause,
                }
            } else {
                round.round().await
            };
            let wait = async {
                match pause {
                    Pause::None => yield_now().await,
                    Pause::Woken(d) => match self.wake.as_mut() {
                        Some(wake) => wake.wait(d).await,
                        None => self.timer.wait(d).await,
                    },
                    Pause::Sleep(d) => self.timer.wait(d).await,
                }
            };
            if let Either::Left(()) = first(shutdown.as_mut(), pin!(wait)).await {
                return;
            }
        }
    }
}

enum Either<A, B> {
    Left(A),
    Right(B),
}

/// Polls `a`, then `b`, and returns the first ready; `a` wins a tie.
async fn first<A: Future, B: Future>(
    mut a: Pin<&mut A>,
    mut b: Pin<&mut B>,
) -> Either<A::Output, B::Output> {
    std::future::poll_fn(|cx| {
        if let Poll::Ready(x) = a.as_mut().poll(cx) {
            return Poll::Ready(Either::Left(x));
        }
        if let Poll::Ready(y) = b.as_mut().poll(cx) {
            return Poll::Ready(Either::Right(y));
        }
        Poll::Pending
    })
    .await
}

/// Returns `Pending` once, waking itself: lets the executor run other tasks.
async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx: &mut Context<'_>| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    struct Sleep;
    impl Wake for Sleep {
        async fn wait(&mut self, max: Duration) {
            tokio::time::sleep(max).await
        }
    }

    /// Counts the waits it is asked for (a hint source that never hints).
    struct Hints(Arc<AtomicU32>);
    impl Wake for Hints {
        async fn wait(&mut self, max: Duration) {
            self.0.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(max).await
        }
    }

    struct Script {
        pauses: Vec<Pause>,
        ran: u32,
        round_takes: Duration,
    }
    impl Rounds for Script {
        async fn round(&mut self) -> Pause {
            self.ran += 1;
            tokio::time::sleep(self.round_takes).await;
            self.pauses
                .get(self.ran as usize - 1)
                .copied()
                .unwrap_or(Pause::Sleep(Duration::from_secs(3600)))
        }
    }

    fn script(pauses: Vec<Pause>, round_takes: Duration) -> Script {
        Script {
            pauses,
            ran: 0,
            round_takes,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn pauses_as_asked_and_stops_at_the_next_pause() {
        let hints = Arc::new(AtomicU32::new(0));
        let mut s = script(
            vec![
                Pause::None,
                Pause::Woken(Duration::from_secs(1)),
                Pause::Sleep(Duration::from_secs(1)),
            ],
            Duration::ZERO,
        );
        let start = tokio::time::Instant::now();
        let shutdown = tokio::time::sleep(Duration::from_millis(2500));
        RoundLoop::new(Sleep)
            .woken_by(Hints(hints.clone()))
            .run(&mut s, shutdown)
            .await;
        assert_eq!(s.ran, 4, "at once, after the hint wait, after the sleep");
        assert_eq!(
            hints.load(Ordering::Relaxed),
            1,
            "only Woken waits for hints"
        );
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(2500),
            "prompt at a pause"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_finishes_unless_interrupting() {
        let takes = Duration::from_secs(10);
        let mut s = script(vec![], takes);
        let start = tokio::time::Instant::now();
        RoundLoop::new(Sleep)
            .run(&mut s, tokio::time::sleep(Duration::from_secs(1)))
            .await;
        assert_eq!(start.elapsed(), takes, "the round ran to its end");

        let mut s = script(vec![], takes);
        let start = tokio::time::Instant::now();
        RoundLoop::new(Sleep)
            .interrupting()
            .run(&mut s, tokio::time::sleep(Duration::from_secs(1)))
            .await;
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(1),
            "the round was dropped"
        );
        assert_eq!(s.ran, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_completed_shutdown_wins_over_a_ready_pause() {
        let mut s = script(vec![Pause::None; 100], Duration::ZERO);
        RoundLoop::new(Sleep).run(&mut s, async {}).await;
        assert_eq!(s.ran, 1, "one round, then shutdown is seen at the pause");
    }
}
