//! Index keys: a canonical byte encoding of a term, so two terms share a
//! bitmap exactly when they are `===`. Atoms (by their immediate value, stable
//! for the VM's life; keys are never persisted), integers that fit in i64,
//! binaries and tuples of those are encoded directly, which is several times
//! cheaper than `term_to_binary`; any other term falls back to its external
//! format under its own tag.

use rustler::sys::{enif_get_tuple, ERL_NIF_TERM};
use rustler::types::tuple::make_tuple;
use rustler::{Binary, Encoder, Env, OwnedBinary, Term, TermType};

const ATOM: u8 = b'a';
const INT: u8 = b'i';
const BIN: u8 = b'b';
const TUPLE: u8 = b't';
const OTHER: u8 = b'x';

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

/// The key of `term`.
pub fn term_key(term: Term) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    encode(term, &mut out);
    out
}

/// Appends the key of `term` to `out` (a query reuses one buffer for all its
/// terms). One type check picks the encoding, instead of trying each decoder
/// in turn and building an error for every miss.
pub fn encode(term: Term, out: &mut Vec<u8>) {
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
            Err(_) => encode_other(term, out),
        },
        // A bitstring that is not whole bytes is no Binary: external format.
        TermType::Binary => match term.decode::<Binary>() {
            Ok(bin) => {
                out.push(BIN);
                out.extend_from_slice(&(bin.len() as u64).to_le_bytes());
                out.extend_from_slice(bin.as_slice());
            }
            Err(_) => encode_other(term, out),
        },
        TermType::Tuple => match tuple_elems(term) {
            Some(elems) => {
                out.push(TUPLE);
                out.extend_from_slice(&(elems.len() as u64).to_le_bytes());
                for &raw in elems {
                    encode(elem(term, raw), out);
                }
            }
            None => encode_other(term, out),
        },
        _ => encode_other(term, out),
    }
}

fn encode_other(term: Term, out: &mut Vec<u8>) {
    let external = term.to_binary();
    out.push(OTHER);
    out.extend_from_slice(&(external.len() as u64).to_le_bytes());
    out.extend_from_slice(external.as_slice());
}

/// The term a key was made from. Keys come from `term_key`, so they are well formed.
pub fn key_term<'a>(env: Env<'a>, key: &[u8]) -> Term<'a> {
    let mut rest = key;
    decode(env, &mut rest)
}

fn take<'k>(rest: &mut &'k [u8], n: usize) -> &'k [u8] {
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    head
}

fn take_u64(rest: &mut &[u8]) -> u64 {
    u64::from_le_bytes(take(rest, 8).try_into().expect("8 bytes"))
}

fn decode<'a>(env: Env<'a>, rest: &mut &[u8]) -> Term<'a> {
    let tag = take(rest, 1)[0];
    match tag {
        // SAFETY: the value is an atom's immediate term, valid in every env.
        ATOM => unsafe { Term::new(env, take_u64(rest) as ERL_NIF_TERM) },
        INT => (take_u64(rest) as i64).encode(env),
        BIN => {
            let len = take_u64(rest) as usize;
            let mut bin = OwnedBinary::new(len).expect("binary allocation");
            bin.as_mut_slice().copy_from_slice(take(rest, len));
            bin.release(env).to_term(env)
        }
        TUPLE => {
            let arity = take_u64(rest) as usize;
            let elems: Vec<Term<'a>> = (0..arity).map(|_| decode(env, rest)).collect();
            make_tuple(env, &elems)
        }
        _ => {
            debug_assert_eq!(tag, OTHER);
            let len = take_u64(rest) as usize;
            env.binary_to_term(take(rest, len))
                .map(|(term, _)| term)
                .expect("external term format")
        }
    }
}
