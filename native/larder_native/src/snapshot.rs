//! An index's postings in and out of a `Larder.Table` snapshot file. Export
//! gives each term with its ids in Roaring's portable serialisation, one
//! serialised bitmap per 64Ki-id chunk (so load rebuilds each chunk from its
//! bytes); import checks every byte of that (it comes from a file), checks
//! that every id is one of the file's rows, and builds a whole new state,
//! swapped in at once. The terms themselves travel as Erlang terms: keys
//! hold atoms by their immediate value, which another VM does not share.
//!
//! A few bytes can name many ids (a run container of 15 bytes names 65,536),
//! so what import does is bounded by the rows and the bytes it is given, not
//! by the ids the bytes claim: a chunk is compared with the rows of its range
//! (at a cost of its bytes, never of its ids) before it is kept, and the
//! id-to-terms map, whose size is the (id, term) pairs, is built only for a
//! number of pairs bounded by the rows and the bytes (`max_pairs`).

use crate::atoms;
use crate::budget::Budget;
use crate::error::{reply, NativeError};
use crate::expr::State;
use crate::index::index;
use crate::key::{elem, encode, key_term, next_cell, tuple_elems};
use crate::posting::{Chunk, Posting};
use crate::rev::Reverse;
use roaring::RoaringBitmap;
use rustler::{Binary, Encoder, Env, NifResult, OwnedBinary, Term};
use std::sync::Arc;

/// Chunks of one posting: at most one per high-16-bit key.
const MAX_CHUNKS: usize = 1 << 16;

/// The (id, term) pairs an import may put in an id-to-terms map: 256 per
/// row, plus 8 per byte of postings (a dense bitmap container holds 8 ids a
/// byte; arrays hold fewer), and 2^24 whatever the file. Each posting names
/// at most the rows, but a file of rows x terms pairs (every term naming
/// every row, in a 15-byte run a term) is refused past that, before any
/// pair is built. The price: a table whose rows average more terms than
/// that, in long runs of consecutive ids, can be dumped but not loaded.
const PAIRS_PER_ROW: u64 = 256;
const PAIRS_PER_BYTE: u64 = 8;
const PAIRS_FLOOR: u64 = 1 << 24;

fn max_pairs(rows: u64, bytes: u64) -> u64 {
    PAIRS_PER_ROW
        .saturating_mul(rows)
        .saturating_add(PAIRS_PER_BYTE.saturating_mul(bytes))
        .max(PAIRS_FLOOR)
}

/// The file's row ids, split in 64Ki-id ranges as postings are: each range
/// one single-container bitmap (an array or a bitmap container, never runs)
/// and whether that container is a bitmap.
struct Rows {
    ranges: Vec<(u16, RoaringBitmap, bool)>,
    len: u64,
}

impl Rows {
    /// From a list of binaries of big-endian `u32` row ids, in any order
    /// (an id given twice counts once). O(rows log rows).
    fn of(list: Term) -> Result<Rows, NativeError> {
        let mut ids: Vec<u32> = Vec::new();
        let mut rest = list;
        while let Some(cell) = next_cell(&mut rest) {
            let cell = cell.map_err(|()| NativeError::BadSnapshot)?;
            let bin: Binary = cell.decode().map_err(|_| NativeError::BadSnapshot)?;
            let bytes = bin.as_slice();
            if !bytes.len().is_multiple_of(4) {
                return Err(NativeError::BadSnapshot);
            }
            ids.extend(
                bytes
                    .chunks_exact(4)
                    .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]])),
            );
        }
        ids.sort_unstable();
        ids.dedup();
        let mut ranges = Vec::new();
        for range in ids.chunk_by(|a, b| a >> 16 == b >> 16) {
            let bitmap = RoaringBitmap::from_sorted_iter(range.iter().copied())
                .map_err(|_| NativeError::Internal)?;
            let dense = bitmap.statistics().n_bitset_containers > 0;
            ranges.push(((range[0] >> 16) as u16, bitmap, dense));
        }
        Ok(Rows {
            ranges,
            len: ids.len() as u64,
        })
    }

    /// Whether every id of `ids` (one chunk, of range `high`) is a row: at
    /// most as many ids as the range has rows, and each of them a row. Runs
    /// are checked run by run (a range lookup each), a bitmap container
    /// against a bitmap word by word (1,024 words), anything else id by id
    /// (an array holds 2 bytes an id; a bitmap container checked against an
    /// array of rows holds at most 4,096 ids in its 8 KB). So the cost is
    /// the chunk's bytes times a log, never the ids a run names, nor the
    /// range's rows for every term (which merging two arrays would cost).
    fn hold(&self, high: u16, ids: &RoaringBitmap) -> bool {
        let Ok(at) = self.ranges.binary_search_by_key(&high, |(h, _, _)| *h) else {
            return false;
        };
        let (_, rows, dense) = &self.ranges[at];
        if ids.len() > rows.len() {
            return false;
        }
        let stats = ids.statistics();
        if stats.n_run_containers > 0 || (stats.n_bitset_containers > 0 && *dense) {
            ids.is_subset(rows)
        } else {
            ids.iter().all(|id| rows.contains(id))
        }
    }
}

/// `<<chunks::32, (bytes::32, roaring portable bytes)*>>`, big-endian counts.
fn posting_bytes(posting: &Posting) -> Result<Vec<u8>, NativeError> {
    let size: usize = posting
        .chunks
        .iter()
        .map(|(_, chunk)| 4 + chunk.ids.serialized_size())
        .sum();
    let mut out = Vec::with_capacity(4 + size);
    let count = u32::try_from(posting.chunks.len()).map_err(|_| NativeError::Internal)?;
    out.extend_from_slice(&count.to_be_bytes());
    for (_, chunk) in &posting.chunks {
        let len = u32::try_from(chunk.ids.serialized_size()).map_err(|_| NativeError::Internal)?;
        out.extend_from_slice(&len.to_be_bytes());
        chunk
            .ids
            .serialize_into(&mut out)
            .map_err(|_| NativeError::Internal)?;
    }
    Ok(out)
}

/// Every term of the index as `{term, postings}`, in no particular order.
/// O(terms + bytes), so on a dirty scheduler.
#[rustler::nif(schedule = "DirtyCpu")]
fn index_export<'a>(env: Env<'a>, index_term: Term<'a>) -> NifResult<Term<'a>> {
    let result = (|| {
        let index = index(index_term)?;
        let guard = index.state.load();
        let state = guard.as_deref().ok_or(NativeError::Dropped)?;
        let mut list = Term::list_new_empty(env);
        for (key, posting) in state.bitmaps.iter() {
            let bytes = posting_bytes(posting)?;
            let mut bin = OwnedBinary::new(bytes.len()).ok_or(NativeError::Internal)?;
            bin.as_mut_slice().copy_from_slice(&bytes);
            let pair = (key_term(env, key)?, bin.release(env)).encode(env);
            list = list.list_prepend(pair);
        }
        Ok(list)
    })();
    reply(env, result)
}

fn take<'b>(rest: &mut &'b [u8], n: usize) -> Result<&'b [u8], NativeError> {
    if rest.len() < n {
        return Err(NativeError::BadSnapshot);
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

fn take_u32(rest: &mut &[u8]) -> Result<u32, NativeError> {
    let bytes = take(rest, 4)?;
    let mut word = [0; 4];
    word.copy_from_slice(bytes);
    Ok(u32::from_be_bytes(word))
}

/// The posting that `bytes` (from `posting_bytes`) describe. Each chunk
/// must hold ids, all of one 64Ki range, in ascending ranges, and every id
/// must be one of `rows` (so a posting names at most `rows.len` ids);
/// Roaring's checked deserialisation validates each container. Its work and
/// what it allocates are bounded by a constant times the bytes given (a
/// run container is kept as runs, and checked against the rows as runs).
fn parse_posting(bytes: &[u8], rows: &Rows) -> Result<Posting, NativeError> {
    let mut rest = bytes;
    let count = take_u32(&mut rest)? as usize;
    // Each chunk takes at least 4 + 8 bytes: a count past that is a lie.
    if count == 0 || count > MAX_CHUNKS || count > rest.len() / 12 {
        return Err(NativeError::BadSnapshot);
    }
    let mut posting = Posting::default();
    posting.chunks.reserve_exact(count);
    let mut last: Option<u16> = None;
    for _ in 0..count {
        let len = take_u32(&mut rest)? as usize;
        let mut data = take(&mut rest, len)?;
        let ids =
            RoaringBitmap::deserialize_from(&mut data).map_err(|_| NativeError::BadSnapshot)?;
        if !data.is_empty() {
            return Err(NativeError::BadSnapshot);
        }
        let (Some(min), Some(max)) = (ids.min(), ids.max()) else {
            return Err(NativeError::BadSnapshot);
        };
        let high = (min >> 16) as u16;
        if (max >> 16) as u16 != high
            || last.is_some_and(|last| last >= high)
            || !rows.hold(high, &ids)
        {
            return Err(NativeError::BadSnapshot);
        }
        last = Some(high);
        posting.len = posting.len.saturating_add(ids.len());
        posting.chunks.push((high, Arc::new(Chunk::of(ids))));
    }
    if !rest.is_empty() {
        return Err(NativeError::BadSnapshot);
    }
    Ok(posting)
}

/// Fills an empty index from `entries`, a list of `{term, postings}` as
/// `index_export` gives them, whose ids must all be among `rows` (a list of
/// binaries of big-endian `u32` row ids): all or nothing. A malformed
/// entry, an id that is not a row, a term given twice, more (id, term)
/// pairs than `max_pairs` allows for an id-to-terms map, or an index that
/// already holds a term is `BadSnapshot`.
fn import(index_term: Term, entries: Term, rows: Term) -> Result<(), NativeError> {
    let index = index(index_term)?;
    let rows = Rows::of(rows)?;
    let mut bytes_given: u64 = 0;
    let mut budget = Budget::new(true);
    let mut next = State {
        reverse: index
            .state
            .load()
            .as_deref()
            .ok_or(NativeError::Dropped)?
            .reverse
            .as_ref()
            .map(|_| Default::default()),
        ..State::default()
    };
    let mut key = Vec::with_capacity(64);
    let mut rest = entries;
    while let Some(entry) = next_cell(&mut rest) {
        let entry = entry.map_err(|()| NativeError::BadSnapshot)?;
        let &[term, bytes] = tuple_elems(entry).ok_or(NativeError::BadSnapshot)? else {
            return Err(NativeError::BadSnapshot);
        };
        let (term, bytes) = (elem(entry, term), elem(entry, bytes));
        let bytes: Binary = bytes.decode().map_err(|_| NativeError::BadSnapshot)?;
        bytes_given = bytes_given.saturating_add(bytes.len() as u64);
        let posting = parse_posting(bytes.as_slice(), &rows)?;
        key.clear();
        encode(term, &mut key, &mut budget)?;
        if next.bitmaps.get(&key).is_some() {
            return Err(NativeError::BadSnapshot);
        }
        if next.bitmaps.full() {
            next.bitmaps.grow();
        }
        next.chunks = next.chunks.saturating_add(posting.chunks.len() as u64);
        next.ids = next.ids.saturating_add(posting.len);
        let slot = next
            .bitmaps
            .get_or_insert_with(&key, || posting)
            .ok_or(NativeError::Internal)?;
        if let Some(reverse) = next.reverse.as_mut() {
            Arc::make_mut(slot).tid = reverse.intern(&Arc::from(key.as_slice()))?;
        }
    }
    if let Some(mut reverse) = next.reverse.take() {
        // `next.ids` is the pairs build_reverse sorts and stores.
        if next.ids > max_pairs(rows.len, bytes_given) {
            return Err(NativeError::BadSnapshot);
        }
        build_reverse(&next, &mut reverse);
        next.reverse = Some(reverse);
    }
    let _writer = index.writer(true)?;
    let current = index.state.load_full().ok_or(NativeError::Dropped)?;
    if !current.bitmaps.is_empty() {
        return Err(NativeError::BadSnapshot);
    }
    index.state.store(Some(Arc::new(next)));
    Ok(())
}

/// Fills the id-to-terms map of a fresh index from its postings, one
/// 64Ki-id range at a time: the (low 16 bits, tid) pairs of the range are
/// gathered term by term in tid order and sorted by id, stably (a counting
/// sort when the range is dense), so each row's tids come out sorted and
/// each 64-id leaf is set once. O(pairs + chunks).
fn build_reverse(state: &State, reverse: &mut Reverse) {
    let mut postings: Vec<&Posting> = state.bitmaps.values().map(|p| p.as_ref()).collect();
    postings.sort_unstable_by_key(|p| p.tid);
    let mut highs: Vec<u16> = postings
        .iter()
        .flat_map(|p| p.chunks.iter().map(|(high, _)| *high))
        .collect();
    highs.sort_unstable();
    highs.dedup();
    let mut cursors = vec![0usize; postings.len()];
    let mut pairs: Vec<(u16, u32)> = Vec::new();
    let mut sorted: Vec<(u16, u32)> = Vec::new();
    let mut counts: Vec<u32> = Vec::new();
    for high in highs {
        pairs.clear();
        for (posting, cursor) in postings.iter().zip(cursors.iter_mut()) {
            if let Some((h, chunk)) = posting.chunks.get(*cursor) {
                if *h == high {
                    *cursor += 1;
                    pairs.extend(chunk.ids.iter().map(|id| (id as u16, posting.tid)));
                }
            }
        }
        // Stable by id: tids stay in ascending order within a row.
        if pairs.len() < 1 << 14 {
            pairs.sort_by_key(|&(low, _)| low);
            sorted.clear();
            sorted.extend_from_slice(&pairs);
        } else {
            counts.clear();
            counts.resize(1 << 16, 0);
            for &(low, _) in &pairs {
                counts[low as usize] += 1;
            }
            let mut at = 0u32;
            for count in counts.iter_mut() {
                let n = *count;
                *count = at;
                at += n;
            }
            sorted.clear();
            sorted.resize(pairs.len(), (0, 0));
            for &pair in &pairs {
                let slot = &mut counts[pair.0 as usize];
                sorted[*slot as usize] = pair;
                *slot += 1;
            }
        }
        let mut rest = sorted.as_slice();
        while let Some(&(first, _)) = rest.first() {
            let leaf = first >> 6;
            let n = rest
                .iter()
                .position(|&(low, _)| low >> 6 != leaf)
                .unwrap_or(rest.len());
            let (group, tail) = rest.split_at(n);
            rest = tail;
            let mut ends = [0u32; 64];
            let mut tids = Vec::with_capacity(group.len());
            for &(low, tid) in group {
                tids.push(tid);
                ends[(low & 63) as usize] = tids.len() as u32;
            }
            // A slot with no tids ends where the slot before it ends.
            for slot in 1..64 {
                ends[slot] = ends[slot].max(ends[slot - 1]);
            }
            let base = (u32::from(high) << 16) | (u32::from(leaf) << 6);
            reverse.set_leaf(base, ends, tids);
        }
    }
}

/// Loads exported postings into an empty index, checking their ids against
/// `rows`. O(rows log rows + terms + bytes, + (id, term) pairs with
/// `reverse`, at most `max_pairs(rows, bytes)`), so on a dirty scheduler.
#[rustler::nif(schedule = "DirtyCpu")]
fn index_import<'a>(
    env: Env<'a>,
    index_term: Term<'a>,
    entries: Term<'a>,
    rows: Term<'a>,
) -> NifResult<Term<'a>> {
    reply(
        env,
        import(index_term, entries, rows).map(|()| atoms::ok().encode(env)),
    )
}
