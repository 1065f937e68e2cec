//! The bound on answer bytes the gateway holds at once
//! ([`GatewayConfig::max_held_bytes`](crate::GatewayConfig::max_held_bytes)).
//!
//! An answer to a keyed request is read whole (it is stored for replay) and
//! then sits in memory until its client has read it — a client that reads
//! slowly holds it for as long as the server lets it. Every such answer
//! takes its bytes from one budget: a keyed forward reserves its route's
//! largest answer *before* anything is sent (refused: `503 gateway-busy`,
//! the key released, nothing forwarded), keeps what it read, and gives the
//! rest back; the bytes return when the response body is dropped (sent, or
//! its connection closed). Replays take their body's bytes the same way.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget: one permit per byte.
#[derive(Debug, Clone)]
pub struct Budget {
    bytes: Arc<Semaphore>,
    max: usize,
}

/// Bytes taken from the [`Budget`], given back when dropped.
#[derive(Debug)]
pub struct Held(Option<OwnedSemaphorePermit>);

impl Budget {
    /// A budget of `max` bytes.
    pub fn new(max: usize) -> Self {
        let max = max.min(Semaphore::MAX_PERMITS);
        Self {
            bytes: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// Takes `n` bytes now, or `None` when fewer are free. Zero bytes are
    /// always granted.
    pub fn try_take(&self, n: usize) -> Option<Held> {
        if n == 0 {
            return Some(Held(None));
        }
        let n = u32::try_from(n).ok().filter(|n| *n as usize <= self.max)?;
        self.bytes
            .clone()
            .try_acquire_many_owned(n)
            .ok()
            .map(|p| Held(Some(p)))
    }

    /// Bytes free now.
    #[cfg(test)]
    pub fn available(&self) -> usize {
        self.bytes.available_permits()
    }
}

impl Held {
    /// Nothing held.
    pub fn none() -> Self {
        Self(None)
    }

    /// Keeps `n` bytes (at most what is held) and gives the rest back.
    pub fn shrink_to(&mut self, n: usize) {
        let Some(permit) = &mut self.0 else {
            return;
        };
        let held = permit.num_permits();
        if n >= held {
            return;
        }
        if n == 0 {
            self.0 = None;
            return;
        }
        drop(permit.split(held - n));
    }
}

/// The most bytes handed to the server at once. The server queues a few
/// frames per connection and stops asking while the client does not read,
/// so what it holds beyond the budget is a few of these per connection.
const FRAME: usize = 64 << 10;

/// A whole body that holds its bytes' share of the budget until the last
/// of them is handed to the server. A large body is handed over in
/// copied frames of [`FRAME`] bytes, so the whole buffer is freed — and
/// its share given back — at the same moment, never later.
#[derive(Debug)]
pub struct HeldBody {
    data: Bytes,
    held: Held,
}

impl HeldBody {
    /// `bytes`, holding `held` while any of it is left.
    pub fn new(bytes: Bytes, held: Held) -> Self {
        Self { data: bytes, held }
    }
}

impl Body for HeldBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if this.data.is_empty() {
            this.held = Held::none();
            return Poll::Ready(None);
        }
        let frame = if this.data.len() <= FRAME {
            std::mem::take(&mut this.data)
        } else {
            let frame = Bytes::copy_from_slice(&this.data[..FRAME]);
            this.data = this.data.slice(FRAME..);
            frame
        };
        if this.data.is_empty() {
            // The buffer is gone (or moved on as the last frame): so is
            // its share.
            this.held = Held::none();
        }
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_taken_shrunk_and_given_back_when_the_body_goes() {
        let b = Budget::new(100);
        let mut a = b.try_take(60).unwrap();
        assert!(b.try_take(41).is_none(), "over the budget");
        a.shrink_to(10);
        assert_eq!(b.available(), 90, "the rest given back");
        let body = HeldBody::new(Bytes::from_static(b"0123456789"), a);
        let c = b.try_take(90).unwrap();
        assert_eq!(b.available(), 0);
        drop(body);
        assert_eq!(b.available(), 10);
        drop(c);
        assert_eq!(b.available(), 100);
        assert!(b.try_take(101).is_none(), "never more than the budget");
        assert!(b.try_take(0).is_some());
    }

    #[tokio::test]
    async fn a_large_body_holds_its_share_until_its_last_frame_is_handed_over() {
        use http_body_util::BodyExt;
        let b = Budget::new(1 << 20);
        let n = 3 * FRAME + 5;
        let held = b.try_take(n).unwrap();
        let mut body = HeldBody::new(Bytes::from(vec![7u8; n]), held);
        let mut got = 0;
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            assert!(data.len() <= FRAME);
            got += data.len();
            if got < n {
                assert_eq!(b.available(), (1 << 20) - n, "held while bytes are left");
            }
        }
        assert_eq!(got, n);
        assert_eq!(b.available(), 1 << 20, "given back with the last frame");
    }
}
