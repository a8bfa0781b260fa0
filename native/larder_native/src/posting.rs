//! One term's ids, split into 64Ki-id chunks that snapshots share: a writer
//! copies the list of chunk pointers and only the chunks it changes (at most
//! one Roaring container each, about 8 KB), so a write costs the containers
//! it touches, never the whole posting, and a build in many batches stays
//! linear.

use roaring::RoaringBitmap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes of chunks alive in the whole VM (every index): each chunk's
/// serialized size, added when it is built and taken off when it is freed.
/// Tests read it to check that dropped indexes free their memory.
pub static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The ids of one posting that share their high 16 bits: one container.
#[derive(Default)]
pub struct Chunk {
    pub ids: RoaringBitmap,
    /// The smallest and largest of `ids` (kept by the writer): an `and`
    /// tries only the ids inside every operand's span.
    pub lo: u32,
    pub hi: u32,
    /// This chunk's share of `LIVE_BYTES`.
    counted: usize,
}

impl Clone for Chunk {
    fn clone(&self) -> Self {
        LIVE_BYTES.fetch_add(self.counted, Ordering::Relaxed);
        Chunk {
            ids: self.ids.clone(),
            lo: self.lo,
            hi: self.hi,
            counted: self.counted,
        }
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        LIVE_BYTES.fetch_sub(self.counted, Ordering::Relaxed);
    }
}

impl Chunk {
    /// A chunk holding `ids` (all of one 64Ki-id range, not empty), counted
    /// in `LIVE_BYTES`.
    pub fn of(ids: RoaringBitmap) -> Chunk {
        let mut chunk = Chunk {
            ids,
            ..Chunk::default()
        };
        chunk.recount();
        chunk
    }

    /// Brings the span and the share of `LIVE_BYTES` up to date after a change.
    fn recount(&mut self) {
        self.lo = self.ids.min().unwrap_or(0);
        self.hi = self.ids.max().unwrap_or(0);
        let size = self.ids.serialized_size();
        LIVE_BYTES.fetch_add(size, Ordering::Relaxed);
        LIVE_BYTES.fetch_sub(self.counted, Ordering::Relaxed);
        self.counted = size;
    }
}

/// A term's ids: chunks sorted by their high 16 bits, and the count of ids.
#[derive(Clone, Default)]
pub struct Posting {
    pub chunks: Vec<(u16, Arc<Chunk>)>,
    pub len: u64,
    /// The term's id in the index's id-to-terms map (0 without one).
    pub tid: u32,
}

fn high(id: u32) -> u16 {
    (id >> 16) as u16
}

impl Posting {
    /// The chunk of ids whose high 16 bits are `key`.
    #[inline]
    pub fn chunk(&self, key: u16) -> Option<&Chunk> {
        self.chunks
            .binary_search_by_key(&key, |(k, _)| *k)
            .ok()
            .and_then(|i| self.chunks.get(i))
            .map(|(_, chunk)| chunk.as_ref())
    }

    /// The ids whose high 16 bits are `key`.
    #[inline]
    pub fn find(&self, key: u16) -> Option<&RoaringBitmap> {
        self.chunk(key).map(|chunk| &chunk.ids)
    }

    pub fn contains(&self, id: u32) -> bool {
        self.find(high(id)).is_some_and(|ids| ids.contains(id))
    }

    /// Bytes the ids take (their serialized size, which tracks the containers).
    pub fn bytes(&self) -> usize {
        self.chunks.iter().map(|(_, chunk)| chunk.counted).sum()
    }

    /// Applies `ids` (sorted) to the chunks they fall in, copying each such
    /// chunk unless this posting already owns it alone.
    pub fn update(&mut self, ids: &[u32], add: bool) {
        let mut rest = ids;
        while let Some(&first) = rest.first() {
            let key = high(first);
            let n = rest
                .iter()
                .position(|&id| high(id) != key)
                .unwrap_or(rest.len());
            let (run, tail) = rest.split_at(n);
            rest = tail;
            let at = match self.chunks.binary_search_by_key(&key, |(k, _)| *k) {
                Ok(at) => at,
                Err(_) if !add => continue,
                Err(at) => {
                    self.chunks.insert(at, (key, Arc::new(Chunk::default())));
                    at
                }
            };
            let Some((_, chunk)) = self.chunks.get_mut(at) else {
                continue;
            };
            let chunk = Arc::make_mut(chunk);
            let before = chunk.ids.len();
            if add {
                chunk.ids.extend(run.iter().copied());
            } else {
                for &id in run {
                    chunk.ids.remove(id);
                }
            }
            let after = chunk.ids.len();
            self.len = self.len.saturating_sub(before).saturating_add(after);
            if after == 0 {
                self.chunks.remove(at);
            } else {
                chunk.recount();
            }
        }
    }

    /// Distinct chunks `ids` (sorted) fall in: the chunks a write copies.
    pub fn touched(ids: &[u32]) -> u64 {
        let mut last = None;
        let mut count = 0;
        for &id in ids {
            if last != Some(high(id)) {
                last = Some(high(id));
                count += 1;
            }
        }
        count
    }
}
