//! The map of term keys to postings, as snapshots share it: hash shards in
//! groups, each an `Arc`ed hash table. A writer's copy of the map copies the
//! group pointers; a change copies the group and the shard it falls in,
//! never the other shards. The shards double (in number) as terms grow, so a
//! shard holds 8 to 16 terms on average and a group holds as many shards as
//! there are groups: a write to `k` terms copies about `2 sqrt(terms / 8)`
//! pointers per term. A lookup is a hash, two indexed loads and one probe
//! of a small flat hash table.

use crate::posting::Posting;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::Arc;

/// A small multiply-rotate hasher (as in rustc's FxHash, with a final mix):
/// keys are short encoded terms and the table is private, so SipHash's DoS
/// resistance buys nothing and costs a good part of a lookup.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0; 8];
            word.copy_from_slice(chunk);
            let word = u64::from_le_bytes(word);
            self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
        }
        for &byte in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(byte)).wrapping_mul(K);
        }
    }

    /// Folds the high bits into the low ones: the multiply alone leaves the
    /// low bits depending on only a few bytes of each word.
    fn finish(&self) -> u64 {
        let mut h = self.0;
        h = (h ^ (h >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^ (h >> 33)
    }
}

type Hash = BuildHasherDefault<KeyHasher>;
type Shard = HashMap<Arc<[u8]>, Arc<Posting>, Hash>;
/// A group's shard pointers, in the same allocation as its count (one hop).
type Group = [Option<Arc<Shard>>];

/// Shards start at 2^MIN_BITS and stop doubling at 2^MAX_BITS (then shards
/// grow past 16 terms each instead).
const MIN_BITS: u32 = 2;
const MAX_BITS: u32 = 16;
/// Average terms per shard past which the shards double.
const PER_SHARD: usize = 16;

/// Term key -> posting. Cloning it copies the group pointers only.
#[derive(Clone)]
pub struct Terms {
    groups: Box<[Option<Arc<Group>>]>,
    group_bits: u32,
    shard_bits: u32,
    len: usize,
}

impl Default for Terms {
    fn default() -> Self {
        Terms::with_bits(MIN_BITS)
    }
}

fn nones<T>(n: usize) -> Box<[Option<T>]> {
    (0..n).map(|_| None).collect()
}

impl Terms {
    fn with_bits(bits: u32) -> Self {
        let group_bits = bits / 2;
        Terms {
            groups: nones(1 << group_bits),
            group_bits,
            shard_bits: bits - group_bits,
            len: 0,
        }
    }

    /// The group and shard of a key, from the top bits of its hash (the
    /// shard's own table uses the low bits).
    #[inline]
    fn place(&self, key: &[u8]) -> (usize, usize) {
        let h = Hash::default().hash_one(key);
        let bits = self.group_bits + self.shard_bits;
        // `bits` is at least MIN_BITS > 0, so the shift is below 64.
        let top = (h >> (64 - bits)) as usize;
        (top >> self.shard_bits, top & ((1 << self.shard_bits) - 1))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    pub fn get(&self, key: &[u8]) -> Option<&Arc<Posting>> {
        let (g, s) = self.place(key);
        self.groups.get(g)?.as_ref()?.get(s)?.as_ref()?.get(key)
    }

    /// The shard `key` falls in, owned by this copy (copying the group and
    /// the shard if a snapshot shares them).
    fn shard_mut(&mut self, key: &[u8]) -> Option<&mut Shard> {
        let (g, s) = self.place(key);
        let shards = 1 << self.shard_bits;
        let group = Arc::make_mut(
            self.groups
                .get_mut(g)?
                .get_or_insert_with(|| (0..shards).map(|_| None).collect()),
        );
        Some(Arc::make_mut(
            group.get_mut(s)?.get_or_insert_with(Default::default),
        ))
    }

    /// Pointers a change to `key` copies when a snapshot shares its group
    /// and shard.
    pub fn copy_cost(&self, key: &[u8]) -> usize {
        let (g, s) = self.place(key);
        let shard = self
            .groups
            .get(g)
            .and_then(Option::as_ref)
            .and_then(|group| group.get(s))
            .and_then(Option::as_ref)
            .map_or(0, |shard| shard.len());
        self.groups.len() + (1 << self.shard_bits) + 2 * shard
    }

    /// Whether adding a term would first double the shards.
    pub fn full(&self) -> bool {
        let bits = self.group_bits + self.shard_bits;
        bits < MAX_BITS && self.len >= PER_SHARD << bits
    }

    /// Doubles the shards: O(terms), once per doubling of the terms.
    pub fn grow(&mut self) {
        let mut next = Terms::with_bits(self.group_bits + self.shard_bits + 1);
        for (key, posting) in self.iter() {
            if let Some(shard) = next.shard_mut(key) {
                shard.insert(key.clone(), posting.clone());
                next.len += 1;
            }
        }
        *self = next;
    }

    /// The posting of `key`, owned by this copy; `make` builds it if absent.
    /// `None` only if the table lost the key it was just given.
    pub fn get_or_insert_with(
        &mut self,
        key: &[u8],
        make: impl FnOnce() -> Posting,
    ) -> Option<&mut Arc<Posting>> {
        let exists = self.get(key).is_some();
        if !exists {
            self.len += 1;
        }
        let shard = self.shard_mut(key)?;
        if !exists {
            shard.insert(Arc::from(key), Arc::new(make()));
        }
        shard.get_mut(key)
    }

    pub fn remove(&mut self, key: &[u8]) -> Option<Arc<Posting>> {
        self.get(key)?;
        let removed = self.shard_mut(key)?.remove(key);
        if removed.is_some() {
            self.len -= 1;
        }
        removed
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Arc<[u8]>, &Arc<Posting>)> {
        self.groups
            .iter()
            .flatten()
            .flat_map(|group| group.iter().flatten())
            .flat_map(|shard| shard.iter())
    }

    pub fn values(&self) -> impl Iterator<Item = &Arc<Posting>> {
        self.iter().map(|(_, posting)| posting)
    }

    pub fn keys(&self) -> impl Iterator<Item = &Arc<[u8]>> {
        self.iter().map(|(key, _)| key)
    }
}
