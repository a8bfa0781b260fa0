defmodule Larder.Native do
  # NIF stubs for native/larder_native (Roaring-bitmap indexes, Bag fingerprints), loaded on load.
  @moduledoc false

  # cargo builds native/larder_native when this module is compiled.
  use Larder.Native.Cargo, crate: "native/larder_native", lib: "larder_native"

  @on_load :load_nif
  @lib "native/liblarder_native"

  @doc false
  def load_nif do
    case load(Path.join(:code.priv_dir(:larder), @lib)) do
      :ok ->
        :ok

      {:error, message} ->
        :persistent_term.put({__MODULE__, :load_error}, message)
        IO.warn(message, [])
        # The module still loads, so every stub can say what went wrong.
        :ok
    end
  end

  @doc false
  # Loads the library at `path` (without extension); the error says why and what to run.
  @spec load(Path.t()) :: :ok | {:error, String.t()}
  def load(path), do: explain(:erlang.load_nif(String.to_charlist(path), 0), path)

  @doc false
  # Turns load_nif's answer into :ok or a message that says why and what to run.
  @spec explain(:ok | {:error, {atom(), charlist()}}, Path.t()) :: :ok | {:error, String.t()}
  def explain(result, path) do
    case result do
      :ok ->
        :ok

      {:error, {:reload, _}} ->
        :ok

      {:error, {reason, text}} ->
        {:error,
         "Larder.Native: could not load the NIF library #{path}.so (#{reason}: #{text}). " <>
           "It is built when Larder is compiled (by cargo): run `mix compile` (`mix deps.compile larder` in a project that depends on Larder)."}
    end
  end

  defp not_loaded do
    message =
      :persistent_term.get(
        {__MODULE__, :load_error},
        "Larder.Native: the NIF library is not loaded; run `mix compile`"
      )

    :erlang.nif_error({:nif_not_loaded, message})
  end

  def index_new(_reverse), do: not_loaded()
  def index_query(_index, _expr), do: not_loaded()
  def index_query_dirty(_index, _expr), do: not_loaded()
  def index_count(_index, _expr), do: not_loaded()
  def index_count_dirty(_index, _expr), do: not_loaded()
  def index_query_many(_index, _exprs), do: not_loaded()
  def index_query_many_dirty(_index, _exprs), do: not_loaded()
  def index_apply(_index, _ops), do: not_loaded()
  def index_apply_dirty(_index, _ops), do: not_loaded()
  def index_terms(_index), do: not_loaded()
  def index_terms_of(_index, _id), do: not_loaded()
  def index_terms_of_dirty(_index, _id), do: not_loaded()
  def index_memory(_index), do: not_loaded()
  def index_drop(_index), do: not_loaded()
  def index_live_bytes, do: not_loaded()
  def index_fork(_index), do: not_loaded()
  def index_export(_index), do: not_loaded()
  def index_import(_index, _entries, _rows), do: not_loaded()
  def table_row_ids(_items), do: not_loaded()
  def table_payload_row_ids(_payload), do: not_loaded()
  def table_payload_row_ids_dirty(_payload), do: not_loaded()
  def table_row_ids_dirty(_items), do: not_loaded()
  def table_rows_expand(_fields, _items), do: not_loaded()
  def table_rows_expand_dirty(_fields, _items), do: not_loaded()
  def index_group(_list), do: not_loaded()
  def index_group_dirty(_list), do: not_loaded()

  def file_lock(_path, _note), do: not_loaded()
  def file_lock_release(_lock), do: not_loaded()

  def bag_fps_new(_shards), do: not_loaded()
  def bag_fps_add(_set, _key_hash, _value_hash), do: not_loaded()
  def bag_fps_incr(_set, _key_hash, _value_hash), do: not_loaded()
  def bag_fps_remove(_set, _key_hash, _value_hash), do: not_loaded()
  def bag_fps_add_dirty(_set, _key_hash, _value_hash), do: not_loaded()
  def bag_fps_incr_dirty(_set, _key_hash, _value_hash), do: not_loaded()
  def bag_fps_remove_dirty(_set, _key_hash, _value_hash), do: not_loaded()
  def bag_fps_incr_many(_set, _fps), do: not_loaded()
  def bag_fps_incr_many_dirty(_set, _fps), do: not_loaded()
  def bag_fps_remove_many(_set, _fps), do: not_loaded()
  def bag_fps_remove_many_dirty(_set, _fps), do: not_loaded()
  def bag_fps_clear(_set, _index), do: not_loaded()
  def bag_fps_memory(_set), do: not_loaded()
  def bag_fps_count(_set), do: not_loaded()
  def bag_fps_add_bin(_set, _fps), do: not_loaded()
  def bag_fps_add_bin_dirty(_set, _fps), do: not_loaded()
  def bag_fps_slots(_fps, _slots), do: not_loaded()
end
