//! The work budget of a call on a normal scheduler: decoding and planning
//! count their work as they go and give up with `NativeError::Dirty` past
//! about a millisecond, so Elixir re-calls the dirty-scheduler variant.

use crate::error::NativeError;

/// Work units a normal-scheduler call may spend; one unit is an id, a term
/// node, an expression node or about 256 bytes copied (tens of nanoseconds).
const NORMAL: u64 = 20_000;

pub struct Budget {
    left: u64,
}

impl Budget {
    /// A budget for a call on a normal scheduler (`dirty == false`) or an
    /// unlimited one for a dirty scheduler.
    pub fn new(dirty: bool) -> Self {
        Budget {
            left: if dirty { u64::MAX } else { NORMAL },
        }
    }

    /// Whether the call runs on a dirty scheduler (its budget has no limit).
    pub fn dirty(&self) -> bool {
        self.left > NORMAL
    }

    /// Spends `units`, or answers `Dirty` when the budget runs out.
    #[inline]
    pub fn spend(&mut self, units: u64) -> Result<(), NativeError> {
        match self.left.checked_sub(units) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => Err(NativeError::Dirty),
        }
    }
}
