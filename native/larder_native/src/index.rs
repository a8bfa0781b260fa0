//! The index resource: term -> Roaring bitmap of u32 ids, published as
//! immutable snapshots. A reader loads the current snapshot (an `Arc` swap,
//! no lock) and works on it while writers go on; a writer copies the
//! snapshot (the group pointers of the sharded term map, `terms.rs`;
//! postings, their chunks and the id-to-terms map are shared), applies a
//! whole batch to its copy, copying only the shards, chunks and map leaves
//! it changes, and swaps it in, so no reader sees half of a batch. Writers
//! serialise among themselves on one mutex, which guards no data: a writer
//! that fails leaves nothing half-written to repair.

use crate::atoms;
use crate::budget::Budget;
use crate::error::{reply, NativeError};
use crate::expr::{
    chunks_len, estimate, estimate_query, eval, eval_query_ids, plan, prepare, State,
};
use crate::key::{encode, key_term, next_cell};
use crate::posting::{Posting, LIVE_BYTES};
use crate::rev::{Change, Reverse};
use crate::terms::KeyHasher;
use arc_swap::{ArcSwapOption, Guard};
use rustler::types::tuple::get_tuple;
use rustler::{Binary, Decoder, Encoder, Env, NifResult, ResourceArc, Term};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

/// Past this many containers touched, a query leaves the normal scheduler.
const DIRTY_CONTAINERS: u64 = 2_000;
/// Past this many ids returned, a query leaves the normal scheduler.
const DIRTY_IDS: u64 = 20_000;
/// Past this many terms, a scan over every term leaves the normal scheduler.
const DIRTY_TERMS: usize = 5_000;
/// Past this many expressions, `query_many` leaves the normal scheduler.
const DIRTY_EXPRS: usize = 64;
/// Budget units a write spends per chunk (one container) it copies: the
/// copy of up to 8 KB, its allocation, and the free of the chunk it
/// replaces once no snapshot holds it, which cost several microseconds on
/// a 2-core VM. Set so that the slowest write of 10-200 catalogue records
/// that stays on a normal scheduler takes about 1 ms there.
const COPY_UNITS: u64 = 128;

pub struct IndexResource {
    /// The current snapshot; `None` once the index is dropped.
    pub(crate) state: ArcSwapOption<State>,
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

pub(crate) type Index = ResourceArc<IndexResource>;

/// The index behind a handle; a forged or foreign handle is `BadIndex`.
pub(crate) fn index(term: Term) -> Result<Index, NativeError> {
    Index::decode(term).map_err(|_| NativeError::BadIndex)
}

impl IndexResource {
    /// The writers' mutex. It guards no data (a writer publishes only whole
    /// snapshots), so a poisoned one is simply taken. With `wait == false`
    /// (a normal scheduler) a busy mutex is `Dirty`: the call moves to a dirty
    /// scheduler and waits there.
    pub(crate) fn writer(&self, wait: bool) -> Result<MutexGuard<'_, ()>, NativeError> {
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

/// The current snapshot of the index behind `term`: a guard that keeps it
/// alive without touching a shared reference count (readers on several
/// schedulers do not contend). `as_deref()` is `None` once dropped.
fn snapshot(term: Term) -> Result<Guard<Option<Arc<State>>>, NativeError> {
    Ok(index(term)?.state.load())
}

/// What a NIF's body answers: a term, or the error `reply` encodes.
type Answer<'a> = Result<Term<'a>, NativeError>;

fn too_costly(cost: (u64, u64)) -> bool {
    cost.0 > DIRTY_CONTAINERS || cost.1 > DIRTY_IDS
}

/// A new index; with `reverse` it keeps an id-to-terms map.
#[rustler::nif]
fn index_new(reverse: bool) -> Index {
    let state = State {
        reverse: reverse.then(Reverse::default),
        ..State::default()
    };
    ResourceArc::new(IndexResource {
        state: ArcSwapOption::from_pointee(state),
        writer: Mutex::new(()),
    })
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

/// A new index holding the current snapshot of `index_term`: the `Arc` is
/// cloned, nothing is copied, so it is O(1) on a normal scheduler. A write
/// to either index copies only what it changes (see the module doc), so the
/// fork keeps the state of the moment it was taken while the original goes
/// on: a table's dump exports the fork while its writer keeps writing.
#[rustler::nif]
fn index_fork<'a>(env: Env<'a>, index_term: Term<'a>) -> NifResult<Term<'a>> {
    let result = index(index_term).and_then(|index| {
        let current = index.state.load_full().ok_or(NativeError::Dropped)?;
        let fork = ResourceArc::new(IndexResource {
            state: ArcSwapOption::new(Some(current)),
            writer: Mutex::new(()),
        });
        Ok(fork.encode(env))
    });
    reply(env, result)
}

/// Defines a NIF pair over `$fun(env, index, arg, dirty) -> Answer`: `$name`
/// runs on a normal scheduler, where `$fun` answers `:dirty` when the call
/// could run past about a millisecond, and `$dirty` runs the same call on a
/// dirty CPU scheduler (Elixir calls it on that answer).
macro_rules! scheduled_nifs {
    ($name:ident, $dirty:ident, $fun:ident) => {
        #[rustler::nif]
        fn $name<'a>(env: Env<'a>, index: Term<'a>, arg: Term<'a>) -> NifResult<Term<'a>> {
            reply(env, $fun(env, index, arg, false))
        }

        #[rustler::nif(schedule = "DirtyCpu")]
        fn $dirty<'a>(env: Env<'a>, index: Term<'a>, arg: Term<'a>) -> NifResult<Term<'a>> {
            reply(env, $fun(env, index, arg, true))
        }
    };
}

// Queries: the normal-scheduler variants count their decoding work and
// estimate the evaluation's cost, and answer `:dirty` when the call could run
// past about a millisecond; Elixir then calls the dirty variant.

thread_local! {
    /// Scratch buffers a query reuses on its scheduler thread: the key of
    /// the term being looked up, and the ids of an answer before they become
    /// a list. A call takes them out and puts them back when done.
    static KEY: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
    static IDS: Cell<Vec<u32>> = const { Cell::new(Vec::new()) };
}

/// Past this many ids, an answer's buffer is freed after use, not kept.
const KEEP_IDS: usize = 1 << 16;
/// Past this many bytes, the key buffer is freed after use, not kept.
const KEEP_KEY: usize = 4096;

/// `ids` as a list, built from its end (no array of terms in between).
fn ids_list<'a>(env: Env<'a>, ids: &[u32]) -> Term<'a> {
    ids.iter()
        .rev()
        .fold(Term::list_new_empty(env), |list, id| {
            list.list_prepend(id.encode(env))
        })
}

/// Runs `f` with the thread's key and ids buffers (empty ones when the
/// thread has none to lend), then keeps them for the next call unless they
/// grew large.
fn with_scratch<R>(f: impl FnOnce(&mut Vec<u8>, &mut Vec<u32>) -> R) -> R {
    let mut key = KEY.try_with(Cell::take).unwrap_or_default();
    let mut ids = IDS.try_with(Cell::take).unwrap_or_default();
    let result = f(&mut key, &mut ids);
    if key.capacity() <= KEEP_KEY {
        let _ = KEY.try_with(|cell| cell.set(key));
    }
    if ids.capacity() <= KEEP_IDS {
        let _ = IDS.try_with(|cell| cell.set(ids));
    }
    result
}

fn query<'a>(env: Env<'a>, index: Term<'a>, expr: Term<'a>, dirty: bool) -> Answer<'a> {
    let guard = snapshot(index)?;
    let state = guard.as_deref().ok_or(NativeError::Dropped)?;
    let mut budget = Budget::new(dirty);
    with_scratch(|key, ids| {
        let query = prepare(&state.bitmaps, expr, key, &mut budget)?;
        if !dirty && too_costly(estimate_query(state, &query)) {
            return Err(NativeError::Dirty);
        }
        eval_query_ids(&state.bitmaps, &query, ids);
        Ok(ids_list(env, ids))
    })
}

scheduled_nifs!(index_query, index_query_dirty, query);

fn count<'a>(env: Env<'a>, index: Term<'a>, expr: Term<'a>, dirty: bool) -> Answer<'a> {
    let guard = snapshot(index)?;
    let state = guard.as_deref().ok_or(NativeError::Dropped)?;
    let mut budget = Budget::new(dirty);
    let plan = plan(
        &state.bitmaps,
        expr,
        &mut Vec::with_capacity(64),
        &mut budget,
    )?;
    if !dirty && estimate(state, &plan).0 > DIRTY_CONTAINERS {
        return Err(NativeError::Dirty);
    }
    Ok(chunks_len(&eval(&state.bitmaps, &plan)).encode(env))
}

scheduled_nifs!(index_count, index_count_dirty, count);

fn query_many<'a>(env: Env<'a>, index: Term<'a>, exprs: Term<'a>, dirty: bool) -> Answer<'a> {
    let guard = snapshot(index)?;
    let state = guard.as_deref().ok_or(NativeError::Dropped)?;
    let mut budget = Budget::new(dirty);
    let mut queries = Vec::new();
    let mut total = (0u64, 0u64);
    // Each expression costs at least a lookup per term, an evaluation and
    // its answer list (several microseconds): past `DIRTY_EXPRS` the call is
    // long whatever the estimate says, so it leaves before planning any.
    if !dirty {
        let mut rest = exprs;
        let mut count = 0;
        while let Some(Ok(_)) = next_cell(&mut rest) {
            count += 1;
            if count > DIRTY_EXPRS {
                return Err(NativeError::Dirty);
            }
        }
    }
    with_scratch(|key, ids| {
        let mut answers: Vec<Term<'a>> = Vec::with_capacity(exprs.list_length().unwrap_or(0));
        let mut rest = exprs;
        while let Some(expr) = next_cell(&mut rest) {
            let expr = expr.map_err(|()| NativeError::BadExpr)?;
            let query = prepare(&state.bitmaps, expr, key, &mut budget)?;
            if dirty {
                // Nothing to decide first: answered at once, while its
                // postings are in cache.
                eval_query_ids(&state.bitmaps, &query, ids);
                answers.push(ids_list(env, ids));
                continue;
            }
            let (w, n) = estimate_query(state, &query);
            total = (total.0.saturating_add(w), total.1.saturating_add(n));
            if too_costly(total) {
                return Err(NativeError::Dirty);
            }
            queries.push(query);
        }
        for query in &queries {
            eval_query_ids(&state.bitmaps, query, ids);
            answers.push(ids_list(env, ids));
        }
        Ok(answers
            .iter()
            .rev()
            .fold(Term::list_new_empty(env), |list, answer| {
                list.list_prepend(*answer)
            }))
    })
}

scheduled_nifs!(index_query_many, index_query_many_dirty, query_many);

// Writes: a list of `{:add | :remove, term, ids}` applied in order to a copy
// of the snapshot, which is then swapped in. Decoding happens before the
// writers' mutex is taken: consecutive operations of the same kind commute,
// so each run of them is grouped by key. The work counted is terms x ids,
// plus the containers of every posting the write copies.
//
// `{:set_terms, terms, ids}` (an index with an id-to-terms map only) gives
// each of `ids` exactly `terms`: once the mutex is taken it becomes a run of
// removes and a run of adds, the difference between those terms and the
// ones the map holds for each id. Its ids may appear in no other operation
// of the batch, so where those runs go in it does not matter.

type IdsByKey = HashMap<Vec<u8>, Vec<u32>, BuildHasherDefault<KeyHasher>>;

struct Run {
    add: bool,
    ids_by_key: IdsByKey,
}

/// A `{:set_terms, terms, ids}`: its ids, and its terms' keys, sorted and
/// without duplicates, as ranges of one buffer (one allocation per op, not
/// per term).
struct SetTerms {
    ids: Vec<u32>,
    bytes: Vec<u8>,
    keys: Vec<std::ops::Range<usize>>,
}

impl SetTerms {
    fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.keys.iter().map(|range| &self.bytes[range.clone()])
    }
}

struct Decoded {
    runs: Vec<Run>,
    sets: Vec<SetTerms>,
}

/// Decodes an id, a proper list of ids or a binary of little-endian u32s
/// (from `index_group`) into `into`.
fn decode_ids(term: Term, into: &mut Vec<u32>, budget: &mut Budget) -> Result<(), NativeError> {
    into.clear();
    if let Ok(id) = term.decode::<u32>() {
        into.push(id);
        return budget.spend(1);
    }
    if let Ok(bytes) = term.decode::<Binary>() {
        let bytes = bytes.as_slice();
        if bytes.len() % 4 != 0 {
            return Err(NativeError::BadIds);
        }
        budget.spend(bytes.len() as u64 / 4)?;
        into.extend(
            bytes
                .chunks_exact(4)
                .map(|id| u32::from_le_bytes([id[0], id[1], id[2], id[3]])),
        );
        return Ok(());
    }
    let mut rest = term;
    while let Some(id) = next_cell(&mut rest) {
        let id = id.map_err(|()| NativeError::BadIds)?;
        into.push(id.decode::<u32>().map_err(|_| NativeError::BadIds)?);
        budget.spend(1)?;
    }
    Ok(())
}

fn decode_ops(ops: Term, budget: &mut Budget) -> Result<Decoded, NativeError> {
    let env = ops.get_env();
    let (add_atom, remove_atom) = (atoms::add().to_term(env), atoms::remove().to_term(env));
    let (add_terms, remove_terms) = (
        atoms::add_terms().to_term(env),
        atoms::remove_terms().to_term(env),
    );
    let set_terms = atoms::set_terms().to_term(env);
    let mut runs: Vec<Run> = Vec::new();
    let mut sets: Vec<SetTerms> = Vec::new();
    let mut ids = Vec::new();
    let mut key = Vec::with_capacity(64);
    let mut rest = ops;
    while let Some(op) = next_cell(&mut rest) {
        let op = op.map_err(|()| NativeError::BadOp)?;
        budget.spend(1)?;
        let elems = get_tuple(op).map_err(|_| NativeError::BadOp)?;
        let &[kind, terms, id_term] = elems.as_slice() else {
            return Err(NativeError::BadOp);
        };
        if kind == set_terms {
            sets.push(decode_set(terms, id_term, budget)?);
            continue;
        }
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
                    ids_by_key: HashMap::default(),
                });
                runs.last_mut().ok_or(NativeError::Internal)?
            }
        };
        let mut add_ids = |term: Term, budget: &mut Budget| -> Result<(), NativeError> {
            budget.spend(ids.len() as u64)?;
            // Encoded into a reused buffer; a key is allocated only for a
            // term this run has not seen.
            key.clear();
            encode(term, &mut key, budget)?;
            match run.ids_by_key.get_mut(key.as_slice()) {
                Some(listed) => listed.extend_from_slice(&ids),
                None => {
                    run.ids_by_key.insert(key.clone(), ids.clone());
                }
            }
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
    // Sorted ids let a posting apply them chunk by chunk.
    for run in &mut runs {
        sort_ids(&mut run.ids_by_key);
    }
    Ok(Decoded { runs, sets })
}

fn sort_ids(ids_by_key: &mut IdsByKey) {
    for ids in ids_by_key.values_mut() {
        ids.sort_unstable();
        ids.dedup();
    }
}

fn decode_set(terms: Term, id_term: Term, budget: &mut Budget) -> Result<SetTerms, NativeError> {
    let mut ids = Vec::new();
    decode_ids(id_term, &mut ids, budget)?;
    ids.sort_unstable();
    ids.dedup();
    let mut bytes = Vec::with_capacity(512);
    let mut keys = Vec::new();
    let mut rest = terms;
    while let Some(term) = next_cell(&mut rest) {
        let term = term.map_err(|()| NativeError::BadOp)?;
        budget.spend(1 + ids.len() as u64)?;
        let start = bytes.len();
        encode(term, &mut bytes, budget)?;
        keys.push(start..bytes.len());
    }
    if !rest.is_empty_list() {
        return Err(NativeError::BadOp);
    }
    keys.sort_unstable_by(|a, b| bytes[a.clone()].cmp(&bytes[b.clone()]));
    keys.dedup_by(|a, b| bytes[a.clone()] == bytes[b.clone()]);
    Ok(SetTerms { ids, bytes, keys })
}

/// Turns the batch's `:set_terms` into a run of removes and a run of adds
/// against `current`'s id-to-terms map, appended to `runs`. `NoReverse`
/// when the index keeps no such map; `BadOp` when an id of theirs appears
/// in two of them or in another operation of the batch.
fn expand_sets(
    current: &State,
    runs: &mut Vec<Run>,
    sets: Vec<SetTerms>,
    budget: &mut Budget,
) -> Result<(), NativeError> {
    if sets.is_empty() {
        return Ok(());
    }
    let reverse = current.reverse.as_ref().ok_or(NativeError::NoReverse)?;
    let mut named: HashSet<u32> = HashSet::new();
    for set in &sets {
        for &id in &set.ids {
            if !named.insert(id) {
                return Err(NativeError::BadOp);
            }
        }
    }
    for run in runs.iter() {
        for ids in run.ids_by_key.values() {
            budget.spend(ids.len() as u64 / 8)?;
            if ids.iter().any(|id| named.contains(id)) {
                return Err(NativeError::BadOp);
            }
        }
    }
    let mut removes = IdsByKey::default();
    let mut adds = IdsByKey::default();
    let mut old: Vec<&[u8]> = Vec::new();
    for set in &sets {
        for &id in &set.ids {
            old.clear();
            old.extend(reverse.terms(id).map(|key| &key[..]));
            old.sort_unstable();
            budget.spend(1 + (old.len() + set.keys.len()) as u64 / 4)?;
            let (mut o, mut n) = (old.iter().peekable(), set.keys().peekable());
            loop {
                match (o.peek(), n.peek()) {
                    (Some(&&was), Some(&now)) if was == now => {
                        o.next();
                        n.next();
                    }
                    (Some(&&was), Some(&now)) if was < now => {
                        removes.entry(was.to_vec()).or_default().push(id);
                        o.next();
                    }
                    (Some(&&was), None) => {
                        removes.entry(was.to_vec()).or_default().push(id);
                        o.next();
                    }
                    (_, Some(&now)) => {
                        adds.entry(now.to_vec()).or_default().push(id);
                        n.next();
                    }
                    (None, None) => break,
                }
            }
        }
    }
    for (add, mut ids_by_key) in [(false, removes), (true, adds)] {
        if !ids_by_key.is_empty() {
            sort_ids(&mut ids_by_key);
            runs.push(Run { add, ids_by_key });
        }
    }
    Ok(())
}

/// Applies `runs` to `state` (a writer's private copy), and the same
/// changes to its id-to-terms map if it has one. Only that map's work can
/// run out of `budget` (the rest was counted before).
fn apply_runs(state: &mut State, runs: Vec<Run>, budget: &mut Budget) -> Result<(), NativeError> {
    let mut reverse = state.reverse.take();
    let mut changes: Vec<Change> = Vec::new();
    let mut released = Vec::new();
    for (seq, run) in runs.into_iter().enumerate() {
        let seq = u32::try_from(seq).map_err(|_| NativeError::Internal)?;
        for (key, ids) in run.ids_by_key {
            if ids.is_empty() {
                continue;
            }
            let key: &[u8] = &key;
            let (chunks, count) = match state.bitmaps.get(key) {
                Some(posting) => (posting.chunks.len() as u64, posting.len),
                None if run.add => {
                    if state.bitmaps.full() {
                        budget.spend(state.bitmaps.len() as u64 / 4)?;
                        state.bitmaps.grow();
                    }
                    (0, 0)
                }
                None => continue,
            };
            let posting = state
                .bitmaps
                .get_or_insert_with(key, Posting::default)
                .ok_or(NativeError::Internal)?;
            // Copies the chunk list unless this write already did; `update`
            // copies the chunks it changes.
            let posting = Arc::make_mut(posting);
            if let Some(reverse) = reverse.as_mut() {
                if count == 0 {
                    posting.tid = reverse.intern(&Arc::from(key))?;
                }
                changes.extend(ids.iter().map(|&id| (id, posting.tid, seq, run.add)));
            }
            posting.update(&ids, run.add);
            let (new_chunks, new_count) = (posting.chunks.len() as u64, posting.len);
            state.chunks = state
                .chunks
                .saturating_sub(chunks)
                .saturating_add(new_chunks);
            state.ids = state.ids.saturating_sub(count).saturating_add(new_count);
            if new_count == 0 {
                released.push(posting.tid);
                state.bitmaps.remove(key);
            }
        }
    }
    if let Some(reverse) = reverse.as_mut() {
        reverse.apply(changes, budget)?;
        reverse.release(&released);
        if state.bitmaps.is_empty() {
            // No term left, so no row has one: start afresh (the free tids go).
            *reverse = Reverse::default();
        }
    }
    state.reverse = reverse;
    Ok(())
}

fn apply<'a>(env: Env<'a>, index_term: Term<'a>, ops: Term<'a>, dirty: bool) -> Answer<'a> {
    let index = index(index_term)?;
    let mut budget = Budget::new(dirty);
    let Decoded { mut runs, sets } = decode_ops(ops, &mut budget)?;
    let unchanged = |runs: &[Run]| {
        runs.iter()
            .all(|run| run.ids_by_key.values().all(Vec::is_empty))
    };
    if sets.is_empty() && unchanged(&runs) {
        // Nothing to change (a re-insert with the same terms): no new snapshot.
        return match index.state.load().as_deref() {
            Some(_) => Ok(atoms::ok().encode(env)),
            None => Err(NativeError::Dropped),
        };
    }
    let _writer = index.writer(dirty)?;
    let current = index.state.load_full().ok_or(NativeError::Dropped)?;
    expand_sets(&current, &mut runs, sets, &mut budget)?;
    if unchanged(&runs) {
        // Every id already had exactly its terms.
        return Ok(atoms::ok().encode(env));
    }
    // A write copies the chunk list of each posting it touches and each
    // chunk it changes: count those.
    for run in &runs {
        for (key, ids) in &run.ids_by_key {
            let listed = current
                .bitmaps
                .get(key.as_slice())
                .map_or(0, |posting| posting.chunks.len() as u64);
            let copied = current.bitmaps.copy_cost(key) as u64;
            budget
                .spend((listed + copied) / 8 + Posting::touched(ids).saturating_mul(COPY_UNITS))?;
        }
    }
    let mut next = State::clone(&current);
    apply_runs(&mut next, runs, &mut budget)?;
    index.state.store(Some(Arc::new(next)));
    Ok(atoms::ok().encode(env))
}

scheduled_nifs!(index_apply, index_apply_dirty, apply);

// Introspection.

#[rustler::nif(schedule = "DirtyCpu")]
fn index_terms<'a>(env: Env<'a>, index: Term<'a>) -> NifResult<Term<'a>> {
    let result = snapshot(index).and_then(|guard| {
        let state = guard.as_deref().ok_or(NativeError::Dropped)?;
        let terms = state
            .bitmaps
            .keys()
            .map(|key| key_term(env, key))
            .collect::<Result<Vec<Term<'a>>, _>>()?;
        Ok(terms.encode(env))
    });
    reply(env, result)
}

fn terms_of<'a>(env: Env<'a>, index: Term<'a>, id: Term<'a>, dirty: bool) -> Answer<'a> {
    let guard = snapshot(index)?;
    let state = guard.as_deref().ok_or(NativeError::Dropped)?;
    let id: u32 = id.decode().map_err(|_| NativeError::BadIds)?;
    let mut budget = Budget::new(dirty);
    if let Some(reverse) = state.reverse.as_ref() {
        let terms = reverse
            .terms(id)
            .map(|key| {
                budget.spend(1 + key.len() as u64 / 16)?;
                key_term(env, key)
            })
            .collect::<Result<Vec<Term<'a>>, _>>()?;
        return Ok(terms.encode(env));
    }
    if !dirty && state.bitmaps.len() > DIRTY_TERMS {
        return Err(NativeError::Dirty);
    }
    let terms = state
        .bitmaps
        .iter()
        .filter(|(_, posting)| posting.contains(id))
        .map(|(key, _)| {
            // Rebuilding a term costs about a unit per node (9 key bytes or more).
            budget.spend(1 + key.len() as u64 / 16)?;
            key_term(env, key)
        })
        .collect::<Result<Vec<Term<'a>>, _>>()?;
    Ok(terms.encode(env))
}

scheduled_nifs!(index_terms_of, index_terms_of_dirty, terms_of);

/// Bytes held: each posting's serialized size (which tracks its containers),
/// each key, and a map node's share per term. O(terms), so on a dirty scheduler.
#[rustler::nif(schedule = "DirtyCpu")]
fn index_memory<'a>(env: Env<'a>, index: Term<'a>) -> NifResult<Term<'a>> {
    let result = snapshot(index).and_then(|guard| {
        let state = guard.as_deref().ok_or(NativeError::Dropped)?;
        let payload: usize = state
            .bitmaps
            .iter()
            .map(|(key, posting)| key.len() + posting.bytes())
            .sum();
        let per_term =
            std::mem::size_of::<(Arc<[u8]>, Arc<Posting>)>() + std::mem::size_of::<Posting>() + 32;
        let reverse = state.reverse.as_ref().map_or(0, Reverse::bytes);
        let bytes = std::mem::size_of::<IndexResource>()
            + payload
            + state.bitmaps.len() * per_term
            + reverse;
        Ok(bytes.encode(env))
    });
    reply(env, result)
}

/// Bytes of postings alive in the VM, across every index (for tests).
#[rustler::nif]
fn index_live_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}
