//! Grouping a build's index terms by term, for `Larder.Table.insert_many/2`:
//! the caller lists each record's row id followed by its terms, and gets back
//! one `{:add, term, ids}` per distinct term, so a term shared by many records
//! is copied to the table's writer and indexed once. Terms are compared as
//! the VM compares them (`enif_is_identical`, after the VM's internal hash),
//! so nothing is encoded here; the index encodes each distinct term once when
//! the writer applies the ops. Hashing and comparing are the VM's own
//! iterative walks: no recursion over user terms here.

use crate::atoms;
use crate::budget::Budget;
use crate::error::{reply, NativeError};
use crate::key::{elem, next_cell, tuple_elems};
use crate::stack::Stack;
use rustler::types::tuple::make_tuple;
use rustler::{Binary, Encoder, Env, NewBinary, NifResult, Term, TermType};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// Bytes of a binary hashed per budget unit.
const BYTES_PER_UNIT: u64 = 256;

/// A term with its VM hash, compared by identity (`=:=`).
struct Grouped<'a> {
    hash: u32,
    term: Term<'a>,
}

impl Hash for Grouped<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u32(self.hash);
    }
}

impl PartialEq for Grouped<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.term == other.term
    }
}

impl Eq for Grouped<'_> {}

/// Spreads the VM's 32-bit hash over 64 bits (the map uses the top bits).
#[derive(Default)]
struct Spread(u64);

impl Hasher for Spread {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 << 8) | u64::from(byte);
        }
    }

    fn write_u32(&mut self, hash: u32) {
        self.0 = u64::from(hash);
    }
}

/// Past this many nodes, a term is hashed on a dirty scheduler.
const FLAT_NODES: usize = 32;

/// What hashing and comparing `term` costs, when it is a small term of
/// tuples, atoms, numbers and binaries (the `{name, value}` of an index,
/// `{name, {char, value}}`); `None` for anything else (lists, maps, more
/// than `FLAT_NODES` nodes), which only a dirty scheduler takes.
fn flat_cost(term: Term) -> Option<u64> {
    let mut pending: Stack<Term, 8> = Stack::new();
    pending.push(term);
    let (mut cost, mut nodes) = (0, 0);
    while let Some(node) = pending.pop() {
        nodes += 1;
        if nodes > FLAT_NODES {
            return None;
        }
        cost += match node.get_type() {
            TermType::Atom | TermType::Integer | TermType::Float => 1,
            TermType::Binary => 1 + node.decode::<Binary>().ok()?.len() as u64 / BYTES_PER_UNIT,
            TermType::List if node.is_empty_list() => 1,
            TermType::Tuple => {
                let elems = tuple_elems(node)?;
                if nodes + pending.len() + elems.len() > FLAT_NODES {
                    return None;
                }
                for &raw in elems {
                    pending.push(elem(node, raw));
                }
                1
            }
            _ => return None,
        };
    }
    Some(cost)
}

fn group<'a>(env: Env<'a>, list: Term<'a>, dirty: bool) -> Result<Term<'a>, NativeError> {
    let mut budget = Budget::new(dirty);
    let mut slots: HashMap<Grouped<'a>, usize, BuildHasherDefault<Spread>> = HashMap::default();
    let mut groups: Vec<(Term<'a>, Vec<u32>)> = Vec::new();
    let mut id: Option<u32> = None;
    let mut rest = list;
    while let Some(item) = next_cell(&mut rest) {
        let item = item.map_err(|()| NativeError::BadOp)?;
        if item.get_type() == TermType::Integer {
            id = Some(item.decode::<u32>().map_err(|_| NativeError::BadIds)?);
            budget.spend(1)?;
            continue;
        }
        let current = id.ok_or(NativeError::BadOp)?;
        if !dirty {
            budget.spend(flat_cost(item).ok_or(NativeError::Dirty)?)?;
        }
        let key = Grouped {
            hash: item.hash_internal(0),
            term: item,
        };
        match slots.get(&key) {
            Some(&slot) => groups
                .get_mut(slot)
                .ok_or(NativeError::Internal)?
                .1
                .push(current),
            None => {
                slots.insert(key, groups.len());
                groups.push((item, vec![current]));
            }
        }
    }
    let add = atoms::add().encode(env);
    Ok(groups
        .iter()
        .rev()
        .fold(Term::list_new_empty(env), |ops, (term, ids)| {
            ops.list_prepend(make_tuple(env, &[add, *term, ids_binary(env, ids)]))
        }))
}

/// `ids` as a binary of little-endian u32s: a binary past 64 bytes is
/// shared, not copied, when the ops are sent to the writer, and the index
/// reads it without walking a list.
fn ids_binary<'a>(env: Env<'a>, ids: &[u32]) -> Term<'a> {
    let mut bytes = NewBinary::new(env, ids.len() * 4);
    for (slot, id) in bytes.as_mut_slice().chunks_exact_mut(4).zip(ids) {
        slot.copy_from_slice(&id.to_le_bytes());
    }
    bytes.into()
}

/// `[id, term, term, id, term, ...]` (each integer the row id of the terms
/// after it) to `[{:add, term, ids}]`, one per distinct term, in the order
/// first seen, each term's ids in the order given, as a binary of
/// little-endian u32s (which `index_apply` takes as ids). `{:error, :bad_op}` for
/// a term before any id or an improper list, `{:error, :bad_ids}` for an
/// integer that is not a u32; `:dirty` past about a millisecond of work.
#[rustler::nif]
fn index_group<'a>(env: Env<'a>, list: Term<'a>) -> NifResult<Term<'a>> {
    reply(env, group(env, list, false))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn index_group_dirty<'a>(env: Env<'a>, list: Term<'a>) -> NifResult<Term<'a>> {
    reply(env, group(env, list, true))
}
