//! Index keys: a canonical byte encoding of a term, so two terms share a
//! bitmap exactly when they are `===`. Atoms (by their immediate value, stable
//! for the VM's life; keys are never persisted), integers that fit in i64,
//! floats, binaries, tuples and list cells are encoded directly, which is
//! several times cheaper than `term_to_binary`; any other term falls back to
//! its external format under its own tag.
//!
//! Floats are encoded by their bits with `-0.0` taken as `0.0`: on OTP 25
//! `-0.0 === 0.0` (they are one map key too), while their external formats
//! differ. A float inside a term that falls back to the external format (a
//! map's value, say) is not normalised.
//!
//! Encoding and decoding walk the term with an explicit stack, never by
//! recursion, so a term of any depth is safe. Both count their work in a
//! `Budget`.

use crate::budget::Budget;
use crate::error::NativeError;
use crate::stack::Stack;
use rustler::sys::{enif_get_tuple, enif_term_to_binary, ErlNifBinary, ERL_NIF_TERM};
use rustler::types::tuple::make_tuple;
use rustler::{Binary, Encoder, Env, OwnedBinary, Term, TermType};
use std::mem::MaybeUninit;

const ATOM: u8 = b'a';
const INT: u8 = b'i';
const BIN: u8 = b'b';
const TUPLE: u8 = b't';
const CONS: u8 = b'c';
const NIL: u8 = b'n';
const FLOAT: u8 = b'f';
const OTHER: u8 = b'x';

/// Bytes copied per budget unit.
const BYTES_PER_UNIT: u64 = 256;

/// The elements of a tuple, read in place (`get_tuple` would allocate a Vec).
pub fn tuple_elems<'a>(term: Term<'a>) -> Option<&'a [ERL_NIF_TERM]> {
    let mut arity = 0;
    let mut array: *const ERL_NIF_TERM = std::ptr::null();
    // SAFETY: enif_get_tuple only reads the term; on success `array` points at
    // `arity` elements that live as long as the term's env.
    unsafe {
        if enif_get_tuple(
            term.get_env().as_c_arg(),
            term.as_c_arg(),
            &mut arity,
            &mut array,
        ) != 1
        {
            return None;
        }
        Some(std::slice::from_raw_parts(array, arity as usize))
    }
}

/// A term of `like`'s env from a raw element of a tuple in that env.
pub fn elem<'a>(like: Term<'a>, raw: ERL_NIF_TERM) -> Term<'a> {
    // SAFETY: `raw` comes from `tuple_elems(like)`, so it belongs to like's env.
    unsafe { Term::new(like.get_env(), raw) }
}

/// One step through a list: `Some(Ok(head))` (and `rest` moves to the tail),
/// `None` at a proper end, `Some(Err(()))` at an improper tail or a non-list.
pub fn next_cell<'a>(rest: &mut Term<'a>) -> Option<Result<Term<'a>, ()>> {
    match rest.list_get_cell() {
        Ok((head, tail)) => {
            *rest = tail;
            Some(Ok(head))
        }
        Err(_) if rest.is_empty_list() => None,
        Err(_) => Some(Err(())),
    }
}

/// Appends the key of `term` to `out` (a query reuses one buffer for all its
/// terms). One type check picks the encoding, instead of trying each decoder
/// in turn and building an error for every miss. Elements wait on an
/// explicit stack, inline while the term is shallow.
pub fn encode(term: Term, out: &mut Vec<u8>, budget: &mut Budget) -> Result<(), NativeError> {
    if !encode_one(term, out, budget)? {
        return Ok(());
    }
    // A tuple of flat terms (the `{field, value}` of a query) needs no stack.
    if let Some(elems) = tuple_elems(term) {
        out.push(TUPLE);
        out.extend_from_slice(&(elems.len() as u64).to_le_bytes());
        for (i, &raw) in elems.iter().enumerate() {
            let element = elem(term, raw);
            if encode_one(element, out, budget)? {
                let mut stack: Stack<Term, 16> = Stack::new();
                for &raw in elems.get(i + 1..).unwrap_or_default().iter().rev() {
                    stack.push(elem(term, raw));
                }
                return encode_nested(element, stack, out, budget);
            }
        }
        return Ok(());
    }
    encode_nested(term, Stack::new(), out, budget)
}

/// Encodes `term`, a tuple or list cell whose header is not written yet, then
/// the terms on `stack`, each whole.
fn encode_nested<'a>(
    term: Term<'a>,
    mut stack: Stack<Term<'a>, 16>,
    out: &mut Vec<u8>,
    budget: &mut Budget,
) -> Result<(), NativeError> {
    let mut next = Some(term);
    while let Some(term) = next.take() {
        if let Some(elems) = tuple_elems(term) {
            out.push(TUPLE);
            out.extend_from_slice(&(elems.len() as u64).to_le_bytes());
            for &raw in elems.iter().rev() {
                stack.push(elem(term, raw));
            }
        } else if let Ok((head, tail)) = term.list_get_cell() {
            out.push(CONS);
            stack.push(tail);
            stack.push(head);
        }
        // The next term that is a tuple or a list cell; flat ones are written.
        while let Some(term) = stack.pop() {
            if encode_one(term, out, budget)? {
                next = Some(term);
                break;
            }
        }
    }
    Ok(())
}

/// Writes a flat term whole and answers `false`, or answers `true` for a
/// tuple or a list cell, whose elements the caller walks.
fn encode_one(term: Term, out: &mut Vec<u8>, budget: &mut Budget) -> Result<bool, NativeError> {
    budget.spend(1)?;
    match term.get_type() {
        TermType::Atom => {
            out.push(ATOM);
            out.extend_from_slice(&(term.as_c_arg() as u64).to_le_bytes());
        }
        TermType::Integer => match term.decode::<i64>() {
            Ok(int) => {
                out.push(INT);
                out.extend_from_slice(&int.to_le_bytes());
            }
            Err(_) => encode_other(term, out, budget)?,
        },
        TermType::Float => match term.decode::<f64>() {
            Ok(float) => {
                // `-0.0 == 0.0` in Rust too: both get the bits of `0.0`.
                let float = if float == 0.0 { 0.0 } else { float };
                out.push(FLOAT);
                out.extend_from_slice(&float.to_bits().to_le_bytes());
            }
            Err(_) => encode_other(term, out, budget)?,
        },
        // A bitstring that is not whole bytes is no Binary: external format.
        TermType::Binary => match term.decode::<Binary>() {
            Ok(bin) => {
                budget.spend(bin.len() as u64 / BYTES_PER_UNIT)?;
                out.push(BIN);
                out.extend_from_slice(&(bin.len() as u64).to_le_bytes());
                out.extend_from_slice(bin.as_slice());
            }
            Err(_) => encode_other(term, out, budget)?,
        },
        TermType::Tuple => return Ok(true),
        TermType::List if term.is_empty_list() => out.push(NIL),
        TermType::List => return Ok(true),
        _ => encode_other(term, out, budget)?,
    }
    Ok(false)
}

/// The external format, for every other term. Its size is only known once it
/// is built, so on a normal scheduler the kinds that can be large (maps, funs,
/// bitstrings) go to a dirty one first.
fn encode_other(term: Term, out: &mut Vec<u8>, budget: &mut Budget) -> Result<(), NativeError> {
    let bounded = matches!(
        term.get_type(),
        TermType::Integer | TermType::Pid | TermType::Port | TermType::Ref
    );
    if !bounded && !budget.dirty() {
        return Err(NativeError::Dirty);
    }
    let mut raw = MaybeUninit::<ErlNifBinary>::uninit();
    // SAFETY: enif_term_to_binary fills `raw` when it answers non-zero; the
    // binary is then ours, and OwnedBinary releases it. (`Term::to_binary`
    // would panic on failure.)
    let external = unsafe {
        if enif_term_to_binary(term.get_env().as_c_arg(), term.as_c_arg(), raw.as_mut_ptr()) == 0 {
            return Err(NativeError::Internal);
        }
        OwnedBinary::from_raw(raw.assume_init())
    };
    budget.spend(external.len() as u64 / BYTES_PER_UNIT)?;
    out.push(OTHER);
    out.extend_from_slice(&(external.len() as u64).to_le_bytes());
    out.extend_from_slice(external.as_slice());
    Ok(())
}

/// The term a key was made from. Keys come from `encode`, so a key that
/// does not decode (or a binary that cannot be allocated) is `Internal`.
pub fn key_term<'a>(env: Env<'a>, key: &[u8]) -> Result<Term<'a>, NativeError> {
    // A tuple or list cell waiting for `left` more values above `base`.
    struct Frame {
        tuple: bool,
        left: usize,
        base: usize,
    }
    let mut rest = key;
    let mut values: Vec<Term<'a>> = Vec::new();
    let mut frames: Vec<Frame> = Vec::new();
    loop {
        let tag = *take(&mut rest, 1)?.first().ok_or(NativeError::Internal)?;
        let value = match tag {
            // SAFETY: the value is an atom's immediate term, valid in every env.
            ATOM => unsafe { Term::new(env, take_u64(&mut rest)? as ERL_NIF_TERM) },
            INT => (take_u64(&mut rest)? as i64).encode(env),
            FLOAT => f64::from_bits(take_u64(&mut rest)?).encode(env),
            NIL => Term::list_new_empty(env),
            BIN => {
                let len =
                    usize::try_from(take_u64(&mut rest)?).map_err(|_| NativeError::Internal)?;
                let bytes = take(&mut rest, len)?;
                let mut bin = OwnedBinary::new(len).ok_or(NativeError::Internal)?;
                bin.as_mut_slice().copy_from_slice(bytes);
                bin.release(env).to_term(env)
            }
            OTHER => {
                let len =
                    usize::try_from(take_u64(&mut rest)?).map_err(|_| NativeError::Internal)?;
                let bytes = take(&mut rest, len)?;
                // SAFETY: the bytes are what enif_term_to_binary made of a
                // term of this VM (keys are never persisted); the trusted
                // decoder also takes the funs and atoms that safe mode refuses.
                unsafe { env.binary_to_term_trusted(bytes) }
                    .map(|(term, _)| term)
                    .ok_or(NativeError::Internal)?
            }
            TUPLE => {
                let arity =
                    usize::try_from(take_u64(&mut rest)?).map_err(|_| NativeError::Internal)?;
                if arity > 0 {
                    frames.push(Frame {
                        tuple: true,
                        left: arity,
                        base: values.len(),
                    });
                    continue;
                }
                make_tuple(env, &[])
            }
            CONS => {
                frames.push(Frame {
                    tuple: false,
                    left: 2,
                    base: values.len(),
                });
                continue;
            }
            _ => return Err(NativeError::Internal),
        };
        values.push(value);
        // Close every frame this value completes.
        loop {
            let Some(frame) = frames.last_mut() else {
                return match (values.pop(), rest.is_empty()) {
                    (Some(term), true) => Ok(term),
                    _ => Err(NativeError::Internal),
                };
            };
            frame.left -= 1;
            if frame.left > 0 {
                break;
            }
            let base = frame.base;
            let tuple = frame.tuple;
            frames.pop();
            let term = if tuple {
                make_tuple(env, values.get(base..).ok_or(NativeError::Internal)?)
            } else {
                match values.get(base..) {
                    Some(&[head, tail]) => tail.list_prepend(head),
                    _ => return Err(NativeError::Internal),
                }
            };
            values.truncate(base);
            values.push(term);
        }
    }
}

fn take<'k>(rest: &mut &'k [u8], n: usize) -> Result<&'k [u8], NativeError> {
    if rest.len() < n {
        return Err(NativeError::Internal);
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

fn take_u64(rest: &mut &[u8]) -> Result<u64, NativeError> {
    let bytes: [u8; 8] = take(rest, 8)?
        .try_into()
        .map_err(|_| NativeError::Internal)?;
    Ok(u64::from_le_bytes(bytes))
}
