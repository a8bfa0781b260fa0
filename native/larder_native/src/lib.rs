//! Larder's NIF: Roaring-bitmap secondary indexes behind `Larder.Index` and
//! `Larder.Table`, and the fingerprint sets behind `Larder.Bag`. Each resource lives in its own module; `rustler::init!`
//! registers every `#[rustler::nif]` function under `Larder.Native`.

mod atoms;
mod bag;
mod budget;
mod error;
mod expr;
mod group;
mod index;
mod key;
mod lockfile;
mod posting;
mod rev;
mod snapshot;
mod stack;
mod terms;
mod trie;

rustler::init!("Elixir.Larder.Native");
