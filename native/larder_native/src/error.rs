//! The NIF's error type: every variant reaches Elixir as `{:error, atom}`.

use crate::atoms;
use rustler::{Atom, Encoder, Env, Term};

#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    #[error("the expression is not a valid index expression")]
    BadExpr,
    #[error("an operation is not {{:add | :remove, term, ids}}")]
    BadOp,
    #[error("ids must be a u32 or a list of u32")]
    BadIds,
    #[error("a writer panicked while holding the index lock")]
    Poisoned,
    #[error("the index was dropped")]
    Dropped,
}

impl NativeError {
    fn atom(&self) -> Atom {
        match self {
            NativeError::BadExpr => atoms::bad_expr(),
            NativeError::BadOp => atoms::bad_op(),
            NativeError::BadIds => atoms::bad_ids(),
            NativeError::Poisoned => atoms::poisoned(),
            NativeError::Dropped => atoms::dropped(),
        }
    }
}

impl Encoder for NativeError {
    fn encode<'a>(&self, env: Env<'a>) -> Term<'a> {
        self.atom().encode(env)
    }
}

impl From<NativeError> for rustler::Error {
    fn from(err: NativeError) -> Self {
        rustler::Error::Term(Box::new(err))
    }
}
