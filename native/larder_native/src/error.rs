//! The NIF's error type: every variant but `Dirty` reaches Elixir as
//! `{:error, atom}`; `Dirty` is the bare atom `:dirty`, which asks Elixir to
//! call the dirty-scheduler variant of the same function.

use crate::atoms;
use rustler::{Atom, Encoder, Env, NifResult, Term};

#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    #[error("the expression is not a valid index expression")]
    BadExpr,
    #[error("an operation is not {{:add | :remove, term, ids}}")]
    BadOp,
    #[error("{{:set_terms, terms, ids}} needs an index with an id-to-terms map")]
    NoReverse,
    #[error("ids must be a u32 or a proper list of u32")]
    BadIds,
    #[error("the handle is not a Larder.Index resource")]
    BadIndex,
    #[error("the index was dropped")]
    Dropped,
    #[error("the expression nests deeper than the limit")]
    TooDeep,
    #[error("a stored key could not be turned back into a term")]
    Internal,
    #[error("index data from a snapshot is malformed, or the index is not empty")]
    BadSnapshot,
    #[error("the call is over the normal scheduler's budget")]
    Dirty,
}

impl NativeError {
    fn atom(&self) -> Atom {
        match self {
            NativeError::BadExpr => atoms::bad_expr(),
            NativeError::BadOp => atoms::bad_op(),
            NativeError::NoReverse => atoms::no_reverse(),
            NativeError::BadIds => atoms::bad_ids(),
            NativeError::BadIndex => atoms::bad_index(),
            NativeError::Dropped => atoms::dropped(),
            NativeError::TooDeep => atoms::too_deep(),
            NativeError::Internal => atoms::internal(),
            NativeError::BadSnapshot => atoms::bad_snapshot(),
            NativeError::Dirty => atoms::dirty(),
        }
    }
}

impl Encoder for NativeError {
    fn encode<'a>(&self, env: Env<'a>) -> Term<'a> {
        self.atom().encode(env)
    }
}

/// The NIF's answer: the value, `:dirty`, or `{:error, reason}`.
pub fn reply<'a>(env: Env<'a>, result: Result<Term<'a>, NativeError>) -> NifResult<Term<'a>> {
    match result {
        Ok(term) => Ok(term),
        Err(NativeError::Dirty) => Ok(atoms::dirty().encode(env)),
        Err(err) => Err(rustler::Error::Term(Box::new(err))),
    }
}
