//! An index's postings in and out of a `Larder.Table` snapshot file. Export
//! gives each term with its ids in Roaring's portable serialisation, one
//! serialised bitmap per 64Ki-id chunk (so load rebuilds each chunk from its
//! bytes, without touching an id); import checks every byte of that (it
//! comes from a file) and builds a whole new state, swapped in at once. The
//! terms themselves travel as Erlang terms: keys hold atoms by their
//! immediate value, which another VM does not share.

use crate::atoms;
use crate::error::{reply, NativeError};
use crate::expr::State;
use crate::index::index;
use crate::key::{encode, key_term, next_cell, tuple_elems, elem};
use crate::posting::{Chunk, Posting};
use crate::budget::Budget;
use crate::rev::Change;
use roaring::RoaringBitmap;
use rustler::{Binary, Encoder, Env, NifResult, OwnedBinary, Term};
use std::sync::Arc;

/// Chunks of one posting: at most one per high-16-bit key.
const MAX_CHUNKS: usize = 1 << 16;

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
/// must hold ids, all of one 64Ki range, in ascending ranges; Roaring's
/// checked deserialisation validates each container. What it allocates is
/// bounded by a constant times the bytes given.
fn parse_posting(bytes: &[u8]) -> Result<Posting, NativeError> {
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
        let ids = RoaringBitmap::deserialize_from(&mut data).map_err(|_| NativeError::BadSnapshot)?;
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
        posting.len = posting.len.saturating_add(ids.len());
        posting.chunks.push((high, Arc::new(Chunk::of(ids))));
    }
    if !rest.is_empty() {
        return Err(NativeError::BadSnapshot);
    }
    Ok(posting)
}

/// Fills an empty index from `entries`, a list of `{term, postings}` as
/// `index_export` gives them: all or nothing. A malformed entry, a term
/// given twice or an index that already holds a term is `BadSnapshot`.
fn import(index_term: Term, entries: Term) -> Result<(), NativeError> {
    let index = index(index_term)?;
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
    let mut changes: Vec<Change> = Vec::new();
    let mut key = Vec::with_capacity(64);
    let mut rest = entries;
    while let Some(entry) = next_cell(&mut rest) {
        let entry = entry.map_err(|()| NativeError::BadSnapshot)?;
        let &[term, bytes] = tuple_elems(entry).ok_or(NativeError::BadSnapshot)? else {
            return Err(NativeError::BadSnapshot);
        };
        let (term, bytes) = (elem(entry, term), elem(entry, bytes));
        let bytes: Binary = bytes.decode().map_err(|_| NativeError::BadSnapshot)?;
        let posting = parse_posting(bytes.as_slice())?;
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
            let posting = Arc::make_mut(slot);
            posting.tid = reverse.intern(&Arc::from(key.as_slice()))?;
            for (_, chunk) in &posting.chunks {
                changes.extend(chunk.ids.iter().map(|id| (id, posting.tid, 0, true)));
            }
        }
    }
    if let Some(reverse) = next.reverse.as_mut() {
        reverse.apply(changes, &mut budget)?;
    }
    let _writer = index.writer(true)?;
    let current = index.state.load_full().ok_or(NativeError::Dropped)?;
    if !current.bitmaps.is_empty() {
        return Err(NativeError::BadSnapshot);
    }
    index.state.store(Some(Arc::new(next)));
    Ok(())
}

/// Loads exported postings into an empty index. O(terms + bytes + ids
/// with `reverse`), so on a dirty scheduler.
#[rustler::nif(schedule = "DirtyCpu")]
fn index_import<'a>(env: Env<'a>, index_term: Term<'a>, entries: Term<'a>) -> NifResult<Term<'a>> {
    reply(env, import(index_term, entries).map(|()| atoms::ok().encode(env)))
}
