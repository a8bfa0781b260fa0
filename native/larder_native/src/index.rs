//! The index resource: term -> Roaring bitmap of u32 ids behind one RwLock.
//! Readers share the lock and never block each other; a batch of writes is
//! applied under the write lock, so no reader sees half of it.

use crate::atoms;
use crate::error::NativeError;
use crate::expr::{estimate, eval, plan, Bitmaps, Posting};
use crate::key::{key_term, term_key};
use roaring::RoaringBitmap;
use rustler::types::tuple::get_tuple;
use rustler::{Encoder, Env, ListIterator, NifResult, ResourceArc, Term};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Past this many containers touched, a query leaves the normal scheduler.
const DIRTY_CONTAINERS: u64 = 2_000;
/// Past this many ids returned, a query leaves the normal scheduler.
const DIRTY_IDS: u64 = 20_000;
/// Past this many terms, a scan over every term leaves the normal scheduler.
const DIRTY_TERMS: usize = 5_000;

#[derive(Default)]
pub struct IndexResource {
    bitmaps: RwLock<Bitmaps>,
    dropped: AtomicBool,
}

#[rustler::resource_impl]
impl rustler::Resource for IndexResource {}

impl IndexResource {
    fn read(&self) -> Result<RwLockReadGuard<'_, Bitmaps>, NativeError> {
        let guard = self.bitmaps.read().map_err(|_| NativeError::Poisoned)?;
        if self.dropped.load(Ordering::Acquire) {
            return Err(NativeError::Dropped);
        }
        Ok(guard)
    }

    fn write(&self) -> Result<RwLockWriteGuard<'_, Bitmaps>, NativeError> {
        let guard = self.bitmaps.write().map_err(|_| NativeError::Poisoned)?;
        if self.dropped.load(Ordering::Acquire) {
            return Err(NativeError::Dropped);
        }
        Ok(guard)
    }
}

type Index = ResourceArc<IndexResource>;

fn too_costly(cost: (u64, u64)) -> bool {
    cost.0 > DIRTY_CONTAINERS || cost.1 > DIRTY_IDS
}

fn encode_ids<'a>(env: Env<'a>, bitmap: &RoaringBitmap) -> Term<'a> {
    bitmap.iter().collect::<Vec<u32>>().encode(env)
}

#[rustler::nif]
fn index_new() -> Index {
    ResourceArc::new(IndexResource::default())
}

// Queries: the normal-scheduler variants estimate the cost first and answer
// `:dirty` when the call could run past about a millisecond; Elixir then calls
// the dirty variant.

fn query<'a>(env: Env<'a>, index: &Index, expr: Term<'a>, check: bool) -> NifResult<Term<'a>> {
    // Decoding under the read lock looks each term up as it is read; readers
    // share the lock, so this only delays a writer by the decoding.
    let bitmaps = index.read()?;
    let plan = plan(&bitmaps, expr, &mut Vec::with_capacity(64))?;
    if check && too_costly(estimate(&bitmaps, &plan)) {
        return Ok(atoms::dirty().encode(env));
    }
    Ok(encode_ids(env, &eval(&bitmaps, &plan)))
}

#[rustler::nif]
fn index_query<'a>(env: Env<'a>, index: Index, expr: Term<'a>) -> NifResult<Term<'a>> {
    query(env, &index, expr, true)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn index_query_dirty<'a>(env: Env<'a>, index: Index, expr: Term<'a>) -> NifResult<Term<'a>> {
    query(env, &index, expr, false)
}

fn count<'a>(env: Env<'a>, index: &Index, expr: Term<'a>, check: bool) -> NifResult<Term<'a>> {
    let bitmaps = index.read()?;
    let plan = plan(&bitmaps, expr, &mut Vec::with_capacity(64))?;
    if check && estimate(&bitmaps, &plan).0 > DIRTY_CONTAINERS {
        return Ok(atoms::dirty().encode(env));
    }
    Ok(eval(&bitmaps, &plan).len().encode(env))
}

#[rustler::nif]
fn index_count<'a>(env: Env<'a>, index: Index, expr: Term<'a>) -> NifResult<Term<'a>> {
    count(env, &index, expr, true)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn index_count_dirty<'a>(env: Env<'a>, index: Index, expr: Term<'a>) -> NifResult<Term<'a>> {
    count(env, &index, expr, false)
}

fn query_many<'a>(
    env: Env<'a>,
    index: &Index,
    exprs: Term<'a>,
    check: bool,
) -> NifResult<Term<'a>> {
    let iter: ListIterator = exprs.decode().map_err(|_| NativeError::BadExpr)?;
    let bitmaps = index.read()?;
    let mut key = Vec::with_capacity(64);
    let plans = iter
        .map(|expr| plan(&bitmaps, expr, &mut key))
        .collect::<Result<Vec<_>, _>>()?;
    if check {
        let total = plans.iter().fold((0, 0), |(w, n), plan| {
            let (ew, en) = estimate(&bitmaps, plan);
            (w + ew, n + en)
        });
        if too_costly(total) {
            return Ok(atoms::dirty().encode(env));
        }
    }
    let results: Vec<Term<'a>> = plans
        .iter()
        .map(|plan| encode_ids(env, &eval(&bitmaps, plan)))
        .collect();
    Ok(results.encode(env))
}

#[rustler::nif]
fn index_query_many<'a>(env: Env<'a>, index: Index, exprs: Term<'a>) -> NifResult<Term<'a>> {
    query_many(env, &index, exprs, true)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn index_query_many_dirty<'a>(env: Env<'a>, index: Index, exprs: Term<'a>) -> NifResult<Term<'a>> {
    query_many(env, &index, exprs, false)
}

// Writes: a list of `{:add | :remove, term, ids}` applied in order under one
// write lock. Decoding happens before the lock is taken: consecutive
// operations of the same kind commute, so each run of them is grouped by term
// (hashing and comparing terms in place) and each distinct term is encoded
// once per run.

struct Run<'a> {
    add: bool,
    ids_by_term: HashMap<Term<'a>, Vec<u32>>,
}

struct Op {
    add: bool,
    key: Vec<u8>,
    ids: Vec<u32>,
}

fn decode_ids(term: Term, into: &mut Vec<u32>) -> Result<(), NativeError> {
    if let Ok(id) = term.decode::<u32>() {
        into.push(id);
        return Ok(());
    }
    let iter: ListIterator = term.decode().map_err(|_| NativeError::BadIds)?;
    for id in iter {
        into.push(id.decode::<u32>().map_err(|_| NativeError::BadIds)?);
    }
    Ok(())
}

fn decode_ops(ops: Term) -> Result<Vec<Op>, NativeError> {
    let iter: ListIterator = ops.decode().map_err(|_| NativeError::BadOp)?;
    let env = ops.get_env();
    let (add_atom, remove_atom) = (atoms::add().to_term(env), atoms::remove().to_term(env));
    let (add_terms, remove_terms) = (
        atoms::add_terms().to_term(env),
        atoms::remove_terms().to_term(env),
    );
    let mut runs: Vec<Run> = Vec::new();
    for op in iter {
        let elems = get_tuple(op).map_err(|_| NativeError::BadOp)?;
        if elems.len() != 3 {
            return Err(NativeError::BadOp);
        }
        // `{:add_terms, [term], ids}` is `{:add, term, ids}` for each term.
        let (add, many) = if elems[0] == add_atom {
            (true, false)
        } else if elems[0] == remove_atom {
            (false, false)
        } else if elems[0] == add_terms {
            (true, true)
        } else if elems[0] == remove_terms {
            (false, true)
        } else {
            return Err(NativeError::BadOp);
        };
        if runs.last().map(|run| run.add) != Some(add) {
            runs.push(Run {
                add,
                ids_by_term: HashMap::new(),
            });
        }
        let run = runs.last_mut().expect("a run was just pushed");
        if many {
            let terms: ListIterator = elems[1].decode().map_err(|_| NativeError::BadOp)?;
            for term in terms {
                decode_ids(elems[2], run.ids_by_term.entry(term).or_default())?;
            }
        } else {
            decode_ids(elems[2], run.ids_by_term.entry(elems[1]).or_default())?;
        }
    }
    Ok(runs
        .into_iter()
        .flat_map(|run| {
            let add = run.add;
            run.ids_by_term.into_iter().map(move |(term, ids)| Op {
                add,
                key: term_key(term),
                ids,
            })
        })
        .collect())
}

fn apply(index: &Index, ops: Term) -> NifResult<rustler::Atom> {
    let ops = decode_ops(ops)?;
    let mut bitmaps = index.write()?;
    for op in ops {
        if op.add && !op.ids.is_empty() {
            let posting = bitmaps.entry(op.key).or_default();
            posting.ids.extend(op.ids);
            posting.refresh();
        } else if op.add {
            continue;
        } else if let Some(posting) = bitmaps.get_mut(&op.key) {
            for id in op.ids {
                posting.ids.remove(id);
            }
            if posting.ids.is_empty() {
                bitmaps.remove(&op.key);
            } else {
                posting.refresh();
            }
        }
    }
    Ok(atoms::ok())
}

#[rustler::nif]
fn index_apply(index: Index, ops: Term) -> NifResult<rustler::Atom> {
    apply(&index, ops)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn index_apply_dirty(index: Index, ops: Term) -> NifResult<rustler::Atom> {
    apply(&index, ops)
}

// Introspection.

#[rustler::nif(schedule = "DirtyCpu")]
fn index_terms<'a>(env: Env<'a>, index: Index) -> NifResult<Term<'a>> {
    let bitmaps = index.read()?;
    let terms: Vec<Term<'a>> = bitmaps.keys().map(|key| key_term(env, key)).collect();
    Ok(terms.encode(env))
}

fn terms_of<'a>(env: Env<'a>, index: &Index, id: u32, check: bool) -> NifResult<Term<'a>> {
    let bitmaps = index.read()?;
    if check && bitmaps.len() > DIRTY_TERMS {
        return Ok(atoms::dirty().encode(env));
    }
    let terms: Vec<Term<'a>> = bitmaps
        .iter()
        .filter(|(_, posting)| posting.ids.contains(id))
        .map(|(key, _)| key_term(env, key))
        .collect();
    Ok(terms.encode(env))
}

#[rustler::nif]
fn index_terms_of<'a>(env: Env<'a>, index: Index, id: u32) -> NifResult<Term<'a>> {
    terms_of(env, &index, id, true)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn index_terms_of_dirty<'a>(env: Env<'a>, index: Index, id: u32) -> NifResult<Term<'a>> {
    terms_of(env, &index, id, false)
}

#[rustler::nif]
fn index_term_count(index: Index) -> NifResult<usize> {
    Ok(index.read()?.len())
}

/// Bytes held: each bitmap's serialized size (which tracks its containers),
/// each key, and the hash table's slots. O(terms), so on a dirty scheduler.
#[rustler::nif(schedule = "DirtyCpu")]
fn index_memory(index: Index) -> NifResult<usize> {
    let bitmaps = index.read()?;
    let payload: usize = bitmaps
        .iter()
        .map(|(key, posting)| key.capacity() + posting.ids.serialized_size())
        .sum();
    let slot = std::mem::size_of::<(Vec<u8>, Posting)>() + 1;
    Ok(std::mem::size_of::<IndexResource>() + payload + bitmaps.capacity() * slot)
}

/// Frees the bitmaps at once, whatever handles remain; later calls answer `{:error, :dropped}`.
#[rustler::nif]
fn index_drop(index: Index) -> rustler::Atom {
    index.dropped.store(true, Ordering::Release);
    let old = match index.bitmaps.write() {
        Ok(mut guard) => std::mem::take(&mut *guard),
        Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
    };
    drop(old);
    atoms::ok()
}
