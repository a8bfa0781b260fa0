//! The index resource: term -> Roaring bitmap of u32 ids, published as
//! immutable snapshots. A reader loads the current snapshot (an `Arc` swap,
//! no lock) and works on it while writers go on; a writer copies the
//! snapshot (O(1): the map is persistent and postings are shared), applies a
//! whole batch to its copy and swaps it in, so no reader sees half of a
//! batch. Writers serialise among themselves on one mutex, which guards no
//! data: a writer that fails leaves nothing half-written to repair.

use crate::atoms;
use crate::budget::Budget;
use crate::error::{reply, NativeError};
use crate::expr::{estimate, eval, plan, Posting, State, LIVE_BYTES};
use crate::key::{key_term, next_cell, term_key};
use arc_swap::ArcSwapOption;
use roaring::RoaringBitmap;
use rustler::types::tuple::get_tuple;
use rustler::{Decoder, Encoder, Env, NifResult, ResourceArc, Term};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

/// Past this many containers touched, a query leaves the normal scheduler.
const DIRTY_CONTAINERS: u64 = 2_000;
/// Past this many ids returned, a query leaves the normal scheduler.
const DIRTY_IDS: u64 = 20_000;
/// Past this many terms, a scan over every term leaves the normal scheduler.
const DIRTY_TERMS: usize = 5_000;
/// Budget units a write spends per container of a posting it copies.
const COPY_UNITS: u64 = 32;

pub struct IndexResource {
    /// The current snapshot; `None` once the index is dropped.
    state: ArcSwapOption<State>,
    writer: Mutex<()>,
}

impl Default for IndexResource {
    fn default() -> Self {
        IndexResource {
            state: ArcSwapOption::from_pointee(State::default()),
            writer: Mutex::new(()),
        }
    }
}

#[rustler::resource_impl]
impl rustler::Resource for IndexResource {}

type Index = ResourceArc<IndexResource>;

/// The index behind a handle; a forged or foreign handle is `BadIndex`.
fn index(term: Term) -> Result<Index, NativeError> {
    Index::decode(term).map_err(|_| NativeError::BadIndex)
}

impl IndexResource {
    /// The writers' mutex. It guards no data (a writer publishes only whole
    /// snapshots), so a poisoned one is simply taken. With `wait == false`
    /// (a normal scheduler) a busy mutex is `Dirty`: the call moves to a dirty
    /// scheduler and waits there.
    fn writer(&self, wait: bool) -> Result<MutexGuard<'_, ()>, NativeError> {
        if wait {
            return Ok(self.writer.lock().unwrap_or_else(|e| e.into_inner()));
        }
        match self.writer.try_lock() {
            Ok(guard) => Ok(guard),
            Err(TryLockError::Poisoned(e)) => Ok(e.into_inner()),
            Err(TryLockError::WouldBlock) => Err(NativeError::Dirty),
        }
    }
}

/// Loads the current snapshot of the index behind `term`.
fn snapshot(term: Term) -> Result<Arc<State>, NativeError> {
    index(term)?.state.load_full().ok_or(NativeError::Dropped)
}

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

/// Frees the index at once, whatever handles remain: the snapshot goes when
/// the last reader in flight lets go of it. Dirty: freeing is O(memory).
#[rustler::nif(schedule = "DirtyCpu")]
fn index_drop<'a>(env: Env<'a>, index_term: Term<'a>) -> NifResult<Term<'a>> {
    let result = index(index_term).map(|index| {
        let _writer = index.writer(true);
        drop(index.state.swap(None));
        atoms::ok().encode(env)
    });
    reply(env, result)
}

// Queries: the normal-scheduler variants count their decoding work and
// estimate the evaluation's cost, and answer `:dirty` when the call could run
// past about a millisecond; Elixir then calls the dirty variant.

fn query<'a>(
    env: Env<'a>,
    index: Term<'a>,
    expr: Term<'a>,
    dirty: bool,
) -> Result<Term<'a>, NativeError> {
    let state = snapshot(index)?;
    let mut budget = Budget::new(dirty);
    let plan = plan(
        &state.bitmaps,
        expr,
        &mut Vec::with_capacity(64),
        &mut budget,
    )?;
    if !dirty && too_costly(estimate(&state, &plan)) {
        return Err(NativeError::Dirty);
    }
    Ok(encode_ids(env, &eval(&state.bitmaps, &plan)))
}

#[rustler::nif]
fn index_query<'a>(env: Env<'a>, index: Term<'a>, expr: Term<'a>) -> NifResult<Term<'a>> {
    reply(env, query(env, index, expr, false))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn index_query_dirty<'a>(env: Env<'a>, index: Term<'a>, expr: Term<'a>) -> NifResult<Term<'a>> {
    reply(env, query(env, index, expr, true))
}

fn count<'a>(
    env: Env<'a>,
    index: Term<'a>,
    expr: Term<'a>,
    dirty: bool,
) -> Result<Term<'a>, NativeError> {
    let state = snapshot(index)?;
    let mut budget = Budget::new(dirty);
    let plan = plan(
        &state.bitmaps,
        expr,
        &mut Vec::with_capacity(64),
        &mut budget,
    )?;
    if !dirty && estimate(&state, &plan).0 > DIRTY_CONTAINERS {
        return Err(NativeError::Dirty);
    }
    Ok(eval(&state.bitmaps, &plan).len().encode(env))
}

#[rustler::nif]
fn index_count<'a>(env: Env<'a>, index: Term<'a>, expr: Term<'a>) -> NifResult<Term<'a>> {
    reply(env, count(env, index, expr, false))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn index_count_dirty<'a>(env: Env<'a>, index: Term<'a>, expr: Term<'a>) -> NifResult<Term<'a>> {
    reply(env, count(env, index, expr, true))
}

fn query_many<'a>(
    env: Env<'a>,
    index: Term<'a>,
    exprs: Term<'a>,
    dirty: bool,
) -> Result<Term<'a>, NativeError> {
    let state = snapshot(index)?;
    let mut budget = Budget::new(dirty);
    let mut key = Vec::with_capacity(64);
    let mut plans = Vec::new();
    let mut rest = exprs;
    while let Some(expr) = next_cell(&mut rest) {
        let expr = expr.map_err(|()| NativeError::BadExpr)?;
        plans.push(plan(&state.bitmaps, expr, &mut key, &mut budget)?);
    }
    if !dirty {
        let total = plans.iter().fold((0u64, 0u64), |(w, n), plan| {
            let (ew, en) = estimate(&state, plan);
            (w.saturating_add(ew), n.saturating_add(en))
        });
        if too_costly(total) {
            return Err(NativeError::Dirty);
        }
    }
    let results: Vec<Term<'a>> = plans
        .iter()
        .map(|plan| encode_ids(env, &eval(&state.bitmaps, plan)))
        .collect();
    Ok(results.encode(env))
}

#[rustler::nif]
fn index_query_many<'a>(env: Env<'a>, index: Term<'a>, exprs: Term<'a>) -> NifResult<Term<'a>> {
    reply(env, query_many(env, index, exprs, false))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn index_query_many_dirty<'a>(
    env: Env<'a>,
    index: Term<'a>,
    exprs: Term<'a>,
) -> NifResult<Term<'a>> {
    reply(env, query_many(env, index, exprs, true))
}

// Writes: a list of `{:add | :remove, term, ids}` applied in order to a copy
// of the snapshot, which is then swapped in. Decoding happens before the
// writers' mutex is taken: consecutive operations of the same kind commute,
// so each run of them is grouped by key. The work counted is terms x ids,
// plus the containers of every posting the write copies.

struct Run {
    add: bool,
    ids_by_key: HashMap<Vec<u8>, Vec<u32>>,
}

/// Decodes an id or a proper list of ids into `into`.
fn decode_ids(term: Term, into: &mut Vec<u32>, budget: &mut Budget) -> Result<(), NativeError> {
    into.clear();
    if let Ok(id) = term.decode::<u32>() {
        into.push(id);
        return budget.spend(1);
    }
    let mut rest = term;
    while let Some(id) = next_cell(&mut rest) {
        let id = id.map_err(|()| NativeError::BadIds)?;
        into.push(id.decode::<u32>().map_err(|_| NativeError::BadIds)?);
        budget.spend(1)?;
    }
    Ok(())
}

fn decode_ops(ops: Term, budget: &mut Budget) -> Result<Vec<Run>, NativeError> {
    let env = ops.get_env();
    let (add_atom, remove_atom) = (atoms::add().to_term(env), atoms::remove().to_term(env));
    let (add_terms, remove_terms) = (
        atoms::add_terms().to_term(env),
        atoms::remove_terms().to_term(env),
    );
    let mut runs: Vec<Run> = Vec::new();
    let mut ids = Vec::new();
    let mut rest = ops;
    while let Some(op) = next_cell(&mut rest) {
        let op = op.map_err(|()| NativeError::BadOp)?;
        budget.spend(1)?;
        let elems = get_tuple(op).map_err(|_| NativeError::BadOp)?;
        let &[kind, terms, id_term] = elems.as_slice() else {
            return Err(NativeError::BadOp);
        };
        // `{:add_terms, [term], ids}` is `{:add, term, ids}` for each term.
        let (add, many) = if kind == add_atom {
            (true, false)
        } else if kind == remove_atom {
            (false, false)
        } else if kind == add_terms {
            (true, true)
        } else if kind == remove_terms {
            (false, true)
        } else {
            return Err(NativeError::BadOp);
        };
        decode_ids(id_term, &mut ids, budget)?;
        let run = match runs.last_mut() {
            Some(run) if run.add == add => run,
            _ => {
                runs.push(Run {
                    add,
                    ids_by_key: HashMap::new(),
                });
                runs.last_mut().ok_or(NativeError::Internal)?
            }
        };
        let mut add_ids = |term: Term, budget: &mut Budget| -> Result<(), NativeError> {
            budget.spend(ids.len() as u64)?;
            let key = term_key(term, budget)?;
            run.ids_by_key
                .entry(key)
                .or_default()
                .extend_from_slice(&ids);
            Ok(())
        };
        if many {
            let mut terms = terms;
            while let Some(term) = next_cell(&mut terms) {
                add_ids(term.map_err(|()| NativeError::BadOp)?, budget)?;
            }
        } else {
            add_ids(terms, budget)?;
        }
    }
    Ok(runs)
}

/// Applies `runs` to `state` (a writer's private copy).
fn apply_runs(state: &mut State, runs: Vec<Run>) {
    for run in runs {
        for (key, ids) in run.ids_by_key {
            if ids.is_empty() {
                continue;
            }
            let key: &[u8] = &key;
            let (chunks, count) = match state.bitmaps.get(key) {
                Some(posting) => (posting.chunks(), posting.ids.len()),
                None if run.add => (0, 0),
                None => continue,
            };
            let posting = match state.bitmaps.get_mut(key) {
                Some(posting) => posting,
                None => state
                    .bitmaps
                    .entry(Arc::from(key))
                    .or_insert_with(|| Arc::new(Posting::default())),
            };
            // Copies the posting unless this write already did.
            let posting = Arc::make_mut(posting);
            if run.add {
                posting.ids.extend(ids);
            } else {
                for id in ids {
                    posting.ids.remove(id);
                }
            }
            posting.refresh();
            let (new_chunks, new_count) = (posting.chunks(), posting.ids.len());
            state.chunks = state
                .chunks
                .saturating_sub(chunks)
                .saturating_add(new_chunks);
            state.ids = state.ids.saturating_sub(count).saturating_add(new_count);
            if new_count == 0 {
                state.bitmaps.remove(key);
            }
        }
    }
}

fn apply<'a>(
    env: Env<'a>,
    index_term: Term<'a>,
    ops: Term<'a>,
    dirty: bool,
) -> Result<Term<'a>, NativeError> {
    let index = index(index_term)?;
    let mut budget = Budget::new(dirty);
    let runs = decode_ops(ops, &mut budget)?;
    let _writer = index.writer(dirty)?;
    let current = index.state.load_full().ok_or(NativeError::Dropped)?;
    // Each posting the write touches is copied: count its containers.
    for run in &runs {
        for key in run.ids_by_key.keys() {
            if let Some(posting) = current.bitmaps.get(key.as_slice()) {
                budget.spend(posting.chunks().saturating_mul(COPY_UNITS))?;
            }
        }
    }
    let mut next = State::clone(&current);
    apply_runs(&mut next, runs);
    index.state.store(Some(Arc::new(next)));
    Ok(atoms::ok().encode(env))
}

#[rustler::nif]
fn index_apply<'a>(env: Env<'a>, index: Term<'a>, ops: Term<'a>) -> NifResult<Term<'a>> {
    reply(env, apply(env, index, ops, false))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn index_apply_dirty<'a>(env: Env<'a>, index: Term<'a>, ops: Term<'a>) -> NifResult<Term<'a>> {
    reply(env, apply(env, index, ops, true))
}

// Introspection.

#[rustler::nif(schedule = "DirtyCpu")]
fn index_terms<'a>(env: Env<'a>, index: Term<'a>) -> NifResult<Term<'a>> {
    let result = snapshot(index).and_then(|state| {
        let terms = state
            .bitmaps
            .keys()
            .map(|key| key_term(env, key))
            .collect::<Result<Vec<Term<'a>>, _>>()?;
        Ok(terms.encode(env))
    });
    reply(env, result)
}

fn terms_of<'a>(
    env: Env<'a>,
    index: Term<'a>,
    id: Term<'a>,
    dirty: bool,
) -> Result<Term<'a>, NativeError> {
    let state = snapshot(index)?;
    let id: u32 = id.decode().map_err(|_| NativeError::BadIds)?;
    if !dirty && state.bitmaps.len() > DIRTY_TERMS {
        return Err(NativeError::Dirty);
    }
    let terms = state
        .bitmaps
        .iter()
        .filter(|(_, posting)| posting.ids.contains(id))
        .map(|(key, _)| key_term(env, key))
        .collect::<Result<Vec<Term<'a>>, _>>()?;
    Ok(terms.encode(env))
}

#[rustler::nif]
fn index_terms_of<'a>(env: Env<'a>, index: Term<'a>, id: Term<'a>) -> NifResult<Term<'a>> {
    reply(env, terms_of(env, index, id, false))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn index_terms_of_dirty<'a>(env: Env<'a>, index: Term<'a>, id: Term<'a>) -> NifResult<Term<'a>> {
    reply(env, terms_of(env, index, id, true))
}

#[rustler::nif]
fn index_term_count<'a>(env: Env<'a>, index: Term<'a>) -> NifResult<Term<'a>> {
    reply(
        env,
        snapshot(index).map(|state| state.bitmaps.len().encode(env)),
    )
}

/// Bytes held: each posting's serialized size (which tracks its containers),
/// each key, and a map node's share per term. O(terms), so on a dirty scheduler.
#[rustler::nif(schedule = "DirtyCpu")]
fn index_memory<'a>(env: Env<'a>, index: Term<'a>) -> NifResult<Term<'a>> {
    let result = snapshot(index).map(|state| {
        let payload: usize = state
            .bitmaps
            .iter()
            .map(|(key, posting)| key.len() + posting.bytes())
            .sum();
        let per_term =
            std::mem::size_of::<(Arc<[u8]>, Arc<Posting>)>() + std::mem::size_of::<Posting>() + 32;
        (std::mem::size_of::<IndexResource>() + payload + state.bitmaps.len() * per_term)
            .encode(env)
    });
    reply(env, result)
}

/// Bytes of postings alive in the VM, across every index (for tests).
#[rustler::nif]
fn index_live_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}
