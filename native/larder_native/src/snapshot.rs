//! An index's postings in and out of a `Larder.Table` snapshot file. Export
//! gives each term with its ids in Roaring's portable serialisation, one
//! serialised bitmap per 64Ki-id chunk (so load rebuilds each chunk from its
//! bytes); import checks every byte of that (it comes from a file), keeps
//! of each posting only the ids that are rows of the file, and builds a
//! whole new state, swapped in at once. The terms themselves travel as
//! Erlang terms: keys hold atoms by their immediate value, which another VM
//! does not share.
//!
//! An id without a row is dropped, and counted: a forged file names them,
//! and so does a genuine dump of a table whose index function is impure (a
//! deleted record's id left under a term the function no longer computes),
//! which must still load, as a search would skip the id anyway. A few bytes
//! can name many ids (a run container of 15 bytes names 65,536), so what
//! import does is bounded by the rows and the bytes it is given, not by the
//! ids the bytes claim: each chunk is ANDed with the rows of its range (at
//! a cost of its bytes and a constant, never of its ids) before it is kept,
//! so a posting names at most the rows; the ids built anew from runs, and
//! the id-to-terms map, whose size is the (id, term) pairs, are bounded by
//! the rows and the bytes (`max_pairs`).

use crate::atoms;
use crate::budget::Budget;
use crate::error::{reply, NativeError};
use crate::expr::State;
use crate::index::index;
use crate::key::{elem, encode, key_term, next_cell, tuple_elems};
use crate::posting::{Chunk, Posting};
use crate::rev::Reverse;
use roaring::RoaringBitmap;
use rustler::sys::{
    enif_make_list_from_array, enif_make_map_from_arrays, enif_make_tuple_from_array, ERL_NIF_TERM,
};
use rustler::{Binary, Encoder, Env, NifResult, OwnedBinary, Term};
use std::collections::HashSet;
use std::sync::Arc;

/// Chunks of one posting: at most one per high-16-bit key.
const MAX_CHUNKS: usize = 1 << 16;

/// The (id, term) pairs an import may put in an id-to-terms map, and the
/// ids it may build anew from run containers that named ids without a row:
/// 256 per row, plus 8 per byte of postings (a dense bitmap container holds
/// 8 ids a byte; arrays hold fewer), and 2^24 whatever the file. Each
/// posting names at most the rows, but a file of rows x terms pairs (every
/// term naming every row, in a 15-byte run a term) is refused past that,
/// before any pair is built; and a 15-byte run cut down to rows that are
/// not consecutive becomes up to 8 KB of array or bitmap, so past that a
/// file is refused before more is built. The index never makes a run
/// container (it only ever holds one a file gave it), so the dump of a
/// table built by writes holds at most 8 ids a byte and reaches neither
/// bound.
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
/// one single-container bitmap (an array or a bitmap container, never runs).
struct Rows {
    ranges: Vec<(u16, RoaringBitmap)>,
    len: u64,
}

/// What `Rows::keep` leaves of a chunk: its ids that are rows (none, or a
/// chunk to keep), how many it dropped, and how many ids it had to build
/// anew from a run container (a run of a few bytes can keep as many rows
/// as its range has; `import` bounds the sum, see `max_pairs`).
struct Kept {
    ids: Option<RoaringBitmap>,
    dropped: u64,
    built_from_runs: u64,
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
            ranges.push(((range[0] >> 16) as u16, bitmap));
        }
        Ok(Rows {
            ranges,
            len: ids.len() as u64,
        })
    }

    /// The ids of `ids` (one chunk, of range `high`) that are rows: the
    /// chunk's AND with the rows of its range, so at most as many ids as
    /// the range has rows; the others are dropped and counted. The chunk
    /// itself is kept when nothing is dropped (a run stays runs). An array
    /// is filtered id by id (a lookup each: its 2 bytes an id, never the
    /// range's rows for every term, which merging two arrays would cost); a
    /// bitmap or run container is ANDed with the range's container, at most
    /// 1,024 words or the range's at most 4,096 array ids, and a result of
    /// at most 8 KB. Counting a run's ids is a sum over its runs. So the
    /// cost is bounded by the chunk's bytes and a constant, never by the
    /// ids a run names.
    fn keep(&self, high: u16, ids: RoaringBitmap) -> Kept {
        let claimed = ids.len();
        let Ok(at) = self.ranges.binary_search_by_key(&high, |(h, _)| *h) else {
            return Kept {
                ids: None,
                dropped: claimed,
                built_from_runs: 0,
            };
        };
        let rows = &self.ranges[at].1;
        // A genuine file's chunk is all rows: against a range of more than
        // 4,096 rows (a bitmap container) the subset test is a lookup an
        // array id, or a pass over at most 1,024 words, and allocates
        // nothing. (Against an array of rows it would merge the two arrays,
        // the range's rows for every term: the filter below avoids that.)
        if rows.len() > 4_096 && ids.is_subset(rows) {
            return Kept {
                ids: Some(ids),
                dropped: 0,
                built_from_runs: 0,
            };
        }
        let stats = ids.statistics();
        let kept = if stats.n_array_containers > 0 {
            // from_sorted_iter cannot fail on a subsequence of sorted ids.
            RoaringBitmap::from_sorted_iter(ids.iter().filter(|&id| rows.contains(id)))
                .unwrap_or_default()
        } else {
            &ids & rows
        };
        let dropped = claimed - kept.len();
        if dropped == 0 {
            return Kept {
                ids: Some(ids),
                dropped,
                built_from_runs: 0,
            };
        }
        let built_from_runs = if stats.n_run_containers > 0 {
            kept.len()
        } else {
            0
        };
        Kept {
            ids: (!kept.is_empty()).then_some(kept),
            dropped,
            built_from_runs,
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
            let pair = (key_term(env, key)?, new_binary(env, &bytes)?).encode(env);
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

/// What an import has dropped and built so far, against its bounds.
struct Tally {
    /// Ids named by postings that are not rows of the file.
    dropped: u64,
    /// Ids built anew from run containers that named ids without a row,
    /// and the most of them an import may build (`max_pairs`).
    built_from_runs: u64,
    max_built: u64,
}

/// The posting that `bytes` (from `posting_bytes`) describe, less the ids
/// that are not `rows` (dropped and counted in `tally`; the posting may be
/// left without chunks). Each chunk must hold ids, all of one 64Ki range,
/// in ascending ranges; Roaring's checked deserialisation validates each
/// container, and keeps a run container as its runs (it reads and
/// allocates 4 bytes a run and at most 8 KB a container, whatever its ids).
/// Each chunk is then cut down to the rows of its range (`Rows::keep`), so
/// the posting names at most the rows. Its work and what it allocates are
/// bounded by a constant times the bytes given, plus the ids built from
/// runs, which `tally` bounds.
fn parse_posting(bytes: &[u8], rows: &Rows, tally: &mut Tally) -> Result<Posting, NativeError> {
    let mut rest = bytes;
    let count = take_u32(&mut rest)? as usize;
    // Each chunk takes at least 4 + 8 bytes: a count past that is a lie.
    if count == 0 || count > MAX_CHUNKS || count > rest.len() / 12 {
        return Err(NativeError::BadSnapshot);
    }
    let mut posting = Posting::default();
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
        if (max >> 16) as u16 != high || last.is_some_and(|last| last >= high) {
            return Err(NativeError::BadSnapshot);
        }
        last = Some(high);
        let kept = rows.keep(high, ids);
        tally.dropped = tally.dropped.saturating_add(kept.dropped);
        tally.built_from_runs = tally.built_from_runs.saturating_add(kept.built_from_runs);
        if tally.built_from_runs > tally.max_built {
            return Err(NativeError::BadSnapshot);
        }
        if let Some(ids) = kept.ids {
            posting.len = posting.len.saturating_add(ids.len());
            posting.chunks.push((high, Arc::new(Chunk::of(ids))));
        }
    }
    if !rest.is_empty() {
        return Err(NativeError::BadSnapshot);
    }
    Ok(posting)
}

/// The bytes of postings in `entries` (those of a malformed entry, which
/// `import` refuses, aside). O(terms).
fn posting_bytes_in(entries: Term) -> u64 {
    let mut total: u64 = 0;
    let mut rest = entries;
    while let Some(Ok(entry)) = next_cell(&mut rest) {
        if let Some(&[_, bytes]) = tuple_elems(entry) {
            if let Ok(bytes) = elem(entry, bytes).decode::<Binary>() {
                total = total.saturating_add(bytes.len() as u64);
            }
        }
    }
    total
}

/// Fills an empty index from `entries`, a list of `{term, postings}` as
/// `index_export` gives them, keeping only the ids that are among `rows`
/// (a list of binaries of big-endian `u32` row ids): all or nothing.
/// Returns how many ids it dropped (a term left without ids is left out).
/// A malformed entry, a term given twice, more ids built from run
/// containers than `max_pairs` allows, more (id, term) pairs than it
/// allows for an id-to-terms map, or an index that already holds a term is
/// `BadSnapshot`.
fn import(index_term: Term, entries: Term, rows: Term) -> Result<u64, NativeError> {
    let index = index(index_term)?;
    let rows = Rows::of(rows)?;
    let bytes_given = posting_bytes_in(entries);
    let mut tally = Tally {
        dropped: 0,
        built_from_runs: 0,
        max_built: max_pairs(rows.len, bytes_given),
    };
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
    // Terms whose ids were all dropped: kept only to refuse them given twice.
    let mut emptied: HashSet<Vec<u8>> = HashSet::new();
    let mut key = Vec::with_capacity(64);
    let mut rest = entries;
    while let Some(entry) = next_cell(&mut rest) {
        let entry = entry.map_err(|()| NativeError::BadSnapshot)?;
        let &[term, bytes] = tuple_elems(entry).ok_or(NativeError::BadSnapshot)? else {
            return Err(NativeError::BadSnapshot);
        };
        let (term, bytes) = (elem(entry, term), elem(entry, bytes));
        let bytes: Binary = bytes.decode().map_err(|_| NativeError::BadSnapshot)?;
        let posting = parse_posting(bytes.as_slice(), &rows, &mut tally)?;
        key.clear();
        encode(term, &mut key, &mut budget)?;
        if next.bitmaps.get(&key).is_some() || emptied.contains(&key) {
            return Err(NativeError::BadSnapshot);
        }
        if posting.chunks.is_empty() {
            emptied.insert(key.clone());
            continue;
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
        // `next.ids` is the pairs build_reverse sorts and stores: every id
        // is a row, but a run of a few bytes per term can name every row.
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
    Ok(tally.dropped)
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

/// A binary of the caller's bytes, copied once into a new off-heap binary.
fn new_binary<'a>(env: Env<'a>, bytes: &[u8]) -> Result<Binary<'a>, NativeError> {
    let mut bin = OwnedBinary::new(bytes.len()).ok_or(NativeError::Internal)?;
    bin.as_mut_slice().copy_from_slice(bytes);
    Ok(bin.release(env))
}

/// The row ids of one rows chunk of a file read from its bytes, before it
/// is decoded: `payload` is the external term format of `[{id, record}]`
/// (uncompressed, as `Larder.Table.Snapshot` writes it), and the answer
/// packs each id as `table_row_ids` does, so the index can be imported
/// while the rows are decoded. Each record is skipped, not built: a count
/// of the terms still to skip (a tuple, list or map adds its elements), no
/// recursion, every length checked against the bytes left, and never more
/// terms pending than bytes left (each takes at least one). A record that
/// holds a term this scan does not know how to skip (a pid, a port, a
/// reference, a fun) gives `:unsupported`, and the caller decodes the chunk
/// first instead; bytes that are not such a list, or an id that is not a
/// 32-bit unsigned integer, `BadSnapshot`. What the scan finds is not
/// trusted either: the caller compares it with the ids of the decoded rows.
/// O(bytes): the caller takes this normal-scheduler version for a payload
/// of at most 256 KiB (well under 1 ms), `table_payload_row_ids_dirty` for
/// a larger one.
#[rustler::nif]
fn table_payload_row_ids<'a>(env: Env<'a>, payload: Binary<'a>) -> NifResult<Term<'a>> {
    reply(env, payload_row_ids(env, payload.as_slice()))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn table_payload_row_ids_dirty<'a>(env: Env<'a>, payload: Binary<'a>) -> NifResult<Term<'a>> {
    reply(env, payload_row_ids(env, payload.as_slice()))
}

enum Scan {
    Bad,
    Unsupported,
}

struct Bytes<'b> {
    rest: &'b [u8],
}

impl<'b> Bytes<'b> {
    fn take(&mut self, n: usize) -> Result<&'b [u8], Scan> {
        if n > self.rest.len() {
            return Err(Scan::Bad);
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, Scan> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<usize, Scan> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn u32(&mut self) -> Result<u64, Scan> {
        let b = self.take(4)?;
        Ok(u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])))
    }

    fn skip(&mut self, n: u64) -> Result<(), Scan> {
        let n = usize::try_from(n).map_err(|_| Scan::Bad)?;
        self.take(n).map(|_| ())
    }

    /// A row id: a small integer, an integer or a small bignum of at most
    /// four bytes, not negative.
    fn id(&mut self) -> Result<u32, Scan> {
        match self.u8()? {
            97 => Ok(u32::from(self.u8()?)),
            98 => {
                let b = self.take(4)?;
                u32::try_from(i32::from_be_bytes([b[0], b[1], b[2], b[3]])).map_err(|_| Scan::Bad)
            }
            110 => {
                let n = usize::from(self.u8()?);
                let sign = self.u8()?;
                let digits = self.take(n)?;
                if sign != 0 || n > 4 {
                    return Err(Scan::Bad);
                }
                Ok(digits
                    .iter()
                    .rev()
                    .fold(0u32, |id, &digit| (id << 8) | u32::from(digit)))
            }
            _ => Err(Scan::Bad),
        }
    }

    /// Skips one whole term.
    fn skip_term(&mut self) -> Result<(), Scan> {
        let mut pending: u64 = 1;
        while pending > 0 {
            pending -= 1;
            match self.u8()? {
                // small integer, integer, old and new float
                97 => self.skip(1)?,
                98 => self.skip(4)?,
                99 => self.skip(31)?,
                70 => self.skip(8)?,
                // atoms: 2-byte and 1-byte lengths
                100 | 118 => {
                    let n = self.u16()?;
                    self.skip(n as u64)?
                }
                115 | 119 => {
                    let n = self.u8()?;
                    self.skip(u64::from(n))?
                }
                // string (a list of bytes), binary, bit binary, bignums
                107 => {
                    let n = self.u16()?;
                    self.skip(n as u64)?
                }
                109 => {
                    let n = self.u32()?;
                    self.skip(n)?
                }
                77 => {
                    let n = self.u32()?;
                    self.skip(1 + n)?
                }
                110 => {
                    let n = self.u8()?;
                    self.skip(1 + u64::from(n))?
                }
                111 => {
                    let n = self.u32()?;
                    self.skip(1 + n)?
                }
                // nil; tuples, a list (its elements and its tail), a map
                106 => {}
                104 => pending += u64::from(self.u8()?),
                105 => pending += self.u32()?,
                108 => pending += self.u32()? + 1,
                116 => pending += 2 * self.u32()?,
                // pids, ports, references, funs, compressed terms, the
                // distribution's atom cache: not skipped here
                80 | 82 | 88 | 89 | 90 | 101 | 102 | 103 | 112 | 113 | 114 | 117 | 120 => {
                    return Err(Scan::Unsupported)
                }
                _ => return Err(Scan::Bad),
            }
            if pending > self.rest.len() as u64 {
                return Err(Scan::Bad);
            }
        }
        Ok(())
    }
}

fn payload_row_ids<'a>(env: Env<'a>, payload: &[u8]) -> Result<Term<'a>, NativeError> {
    match scan_row_ids(payload) {
        Ok(out) => Ok(new_binary(env, &out)?.encode(env)),
        Err(Scan::Unsupported) => Ok(atoms::unsupported().encode(env)),
        Err(Scan::Bad) => Err(NativeError::BadSnapshot),
    }
}

fn scan_row_ids(payload: &[u8]) -> Result<Vec<u8>, Scan> {
    let mut bytes = Bytes { rest: payload };
    if bytes.u8()? != 131 {
        return Err(Scan::Bad);
    }
    let mut out = Vec::new();
    match bytes.u8()? {
        106 => {}
        108 => {
            let n = bytes.u32()?;
            if n > bytes.rest.len() as u64 {
                return Err(Scan::Bad);
            }
            out.reserve(4 * n as usize);
            for _ in 0..n {
                if bytes.u8()? != 104 || bytes.u8()? != 2 {
                    return Err(Scan::Bad);
                }
                out.extend_from_slice(&bytes.id()?.to_be_bytes());
                bytes.skip_term()?;
            }
            if bytes.u8()? != 106 {
                return Err(Scan::Bad);
            }
        }
        _ => return Err(Scan::Bad),
    }
    if bytes.rest.is_empty() {
        Ok(out)
    } else {
        Err(Scan::Bad)
    }
}

/// The row ids of one rows chunk of a file, `[{id, record}]` as
/// `Larder.Table.Snapshot` decoded it, packed as big-endian `u32`s for
/// `index_import`: one binary a chunk, which goes from the decoding process
/// to the loading one without a copy. O(rows of the chunk), a few ns a row:
/// the caller takes this normal-scheduler version for a chunk of at most
/// 16,384 rows (well under 1 ms), `table_row_ids_dirty` for a larger one (a
/// chunk's size comes from a file). A row of another shape is `BadSnapshot`
/// (the caller has checked the rows before).
#[rustler::nif]
fn table_row_ids<'a>(env: Env<'a>, items: Term<'a>) -> NifResult<Term<'a>> {
    reply(env, row_ids(env, items))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn table_row_ids_dirty<'a>(env: Env<'a>, items: Term<'a>) -> NifResult<Term<'a>> {
    reply(env, row_ids(env, items))
}

fn row_ids<'a>(env: Env<'a>, items: Term<'a>) -> Result<Term<'a>, NativeError> {
    let mut out: Vec<u8> = Vec::new();
    let mut rest = items;
    while let Some(cell) = next_cell(&mut rest) {
        let row = cell.map_err(|()| NativeError::BadSnapshot)?;
        let id = match tuple_elems(row) {
            Some(&[id, _]) => elem(row, id)
                .decode::<u32>()
                .map_err(|_| NativeError::BadSnapshot)?,
            _ => return Err(NativeError::BadSnapshot),
        };
        out.extend_from_slice(&id.to_be_bytes());
    }
    Ok(new_binary(env, &out)?.encode(env))
}

/// A `store:` table's rows chunk of a version 2 snapshot, made whole:
/// `{rows, ids}`, where each item `{id, values}` (`values` a tuple of one
/// value per stored field, in the order of `fields`) becomes `{id, map}`,
/// an item `{id, map}` stays as it is (a record that lacks some stored
/// field), and `ids` packs every row id as `table_row_ids` does. The dump
/// writes a stored record as its values alone: decoding a map with
/// `binary_to_term/2`'s `:safe` option costs about five times what its
/// values cost, and the keys are the same in every row. A row of another
/// shape, a tuple of another size or an id that is not a 32-bit
/// unsigned integer is `BadSnapshot` (`fields` come from the caller, who
/// checked them: distinct, at most 32, in term order, so no map needs its
/// keys sorted). O(rows x fields), 0.1-0.25 us a row of 5 fields: the
/// caller takes this normal-scheduler version for a chunk of at most 2,048
/// rows (a dump's), `table_rows_expand_dirty` for a larger one (a chunk's
/// size comes from a file).
#[rustler::nif]
fn table_rows_expand<'a>(env: Env<'a>, fields: Term<'a>, items: Term<'a>) -> NifResult<Term<'a>> {
    reply(env, rows_expand(env, fields, items))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn table_rows_expand_dirty<'a>(
    env: Env<'a>,
    fields: Term<'a>,
    items: Term<'a>,
) -> NifResult<Term<'a>> {
    reply(env, rows_expand(env, fields, items))
}

fn rows_expand<'a>(
    env: Env<'a>,
    fields: Term<'a>,
    items: Term<'a>,
) -> Result<Term<'a>, NativeError> {
    let keys: Vec<Term<'a>> = fields.decode().map_err(|_| NativeError::Internal)?;
    if keys.is_empty() || keys.len() > 32 {
        return Err(NativeError::Internal);
    }
    let keys: Vec<ERL_NIF_TERM> = keys.iter().map(|k| k.as_c_arg()).collect();
    let raw_env = env.as_c_arg();
    let mut rows: Vec<ERL_NIF_TERM> = Vec::new();
    let mut ids: Vec<u8> = Vec::new();
    let mut rest = items;
    while let Some(cell) = next_cell(&mut rest) {
        let row = cell.map_err(|()| NativeError::BadSnapshot)?;
        let &[id_raw, stored_raw] = tuple_elems(row).ok_or(NativeError::BadSnapshot)? else {
            return Err(NativeError::BadSnapshot);
        };
        let id = elem(row, id_raw)
            .decode::<u32>()
            .map_err(|_| NativeError::BadSnapshot)?;
        ids.extend_from_slice(&id.to_be_bytes());
        let stored = elem(row, stored_raw);
        if stored.is_map() {
            rows.push(row.as_c_arg());
            continue;
        }
        let values = tuple_elems(stored).ok_or(NativeError::BadSnapshot)?;
        if values.len() != keys.len() {
            return Err(NativeError::BadSnapshot);
        }
        let mut map: ERL_NIF_TERM = 0;
        // SAFETY: `keys` and `values` hold `keys.len()` terms of this env
        // (the caller's fields, the elements of a tuple in `items`); on
        // success `map` is a new term of this env. Fails (0) only on a key
        // given twice, which the caller's distinct fields rule out.
        let made = unsafe {
            enif_make_map_from_arrays(
                raw_env,
                keys.as_ptr(),
                values.as_ptr(),
                keys.len(),
                &mut map,
            )
        };
        if made == 0 {
            return Err(NativeError::BadSnapshot);
        }
        let pair = [id_raw, map];
        // SAFETY: both elements are terms of this env.
        rows.push(unsafe { enif_make_tuple_from_array(raw_env, pair.as_ptr(), 2) });
    }
    // SAFETY: every element of `rows` is a term of this env.
    let list = unsafe {
        Term::new(
            env,
            enif_make_list_from_array(raw_env, rows.as_ptr(), rows.len() as u32),
        )
    };
    Ok((list, new_binary(env, &ids)?).encode(env))
}

/// Loads exported postings into an empty index, keeping only the ids that
/// are `rows`: `{:ok, dropped}`, the count of ids left out. O(rows log rows
/// + terms + bytes, + ids built from runs, + (id, term) pairs with
/// `reverse`, each at most `max_pairs(rows, bytes)`), so on a dirty
/// scheduler.
#[rustler::nif(schedule = "DirtyCpu")]
fn index_import<'a>(
    env: Env<'a>,
    index_term: Term<'a>,
    entries: Term<'a>,
    rows: Term<'a>,
) -> NifResult<Term<'a>> {
    reply(
        env,
        import(index_term, entries, rows).map(|dropped| (atoms::ok(), dropped).encode(env)),
    )
}
