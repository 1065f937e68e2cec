//! The states a run, a step and a ledger entry go through, and the kinds of
//! step, each with its stored text.

use std::fmt;

macro_rules! named_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The name used in storage and on the command line.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }

            /// Parses a stored name.
            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($text => Some($name::$variant),)*
                    _ => None,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

named_enum! {
    /// Where a run is. Every state has a way out: `running` and
    /// `compensating` runs are resumed by whoever takes their lease once it
    /// expires (a retry of the request, or the recovery worker);
    /// `needs_attention` waits for an operator (`idem steps resolve`);
    /// `completed` and `failed` are final and replayed.
    RunState {
        /// Moving forward.
        Running = "running",
        /// Undoing its completed steps, newest first, after a permanent
        /// failure or its deadline.
        Compensating = "compensating",
        /// Stopped at a step an operator must resolve (an at-most-once
        /// effect whose outcome is unknown, retries exhausted after the
        /// point of no return, a compensation that cannot complete).
        NeedsAttention = "needs_attention",
        /// Finished; its outcome is stored on the key record.
        Completed = "completed",
        /// Finished after compensation (or with a business error); its
        /// outcome is stored on the key record.
        Failed = "failed",
    }
}

impl RunState {
    /// `completed` or `failed`.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Failed)
    }

    /// `running` or `compensating`: an executor may hold it.
    pub fn is_live(self) -> bool {
        matches!(self, Self::Running | Self::Compensating)
    }
}

named_enum! {
    /// What a step does, which decides how it is retried and resolved.
    StepKind {
        /// Local database work, committed with its record: never unknown.
        Phase = "phase",
        /// An external call that accepts the derived key: retried with it.
        Call = "call",
        /// A send to a sink without keys: before sending again, the sink is
        /// asked whether the message id arrived (verify-then-send).
        Send = "send",
        /// An effect that is never retried automatically: an unknown
        /// outcome waits for an operator.
        AtMostOnce = "at_most_once",
        /// The compensation of an external call, itself a recorded call
        /// with its own derived key; when the call's outcome is unknown, its
        /// lookup's attempts are this step's too.
        Undo = "undo",
        /// The compensation of a phase: local work, committed with its record.
        UndoPhase = "undo_phase",
    }
}

named_enum! {
    /// A step's recorded state.
    StepState {
        /// Attempted, no outcome recorded: the effect may or may not have
        /// happened (the call is in flight, or its answer was lost).
        Started = "started",
        /// Done; its result is recorded and returned on resume.
        Done = "done",
        /// Failed for good; recorded and returned on resume.
        Failed = "failed",
        /// The last attempt certainly did nothing (a refused call, a
        /// rolled-back phase, a compensation's lookup, or an operator's
        /// word): it may run once more.
        NotSent = "not_sent",
    }
}

named_enum! {
    /// A message id's state in the send-once ledger.
    MessageState {
        /// An attempt to send it is (or was) under way: outcome unknown.
        Sending = "sending",
        /// Sent: it is never sent again, by this run or any other.
        Sent = "sent",
        /// Not sent, for certain: it may be sent.
        NotSent = "not_sent",
    }
}
