# Builds L2 keys from namespace, version, generation and key, and encodes and
# safely decodes the values and invalidation messages stored in the L2.
defmodule Larder.Cache.Codec do
  @moduledoc false

  def prefix(namespace, version), do: "#{namespace}:#{version}"

  def generation_key(cfg), do: cfg.prefix <> ":gen"

  def channel(cfg), do: cfg.prefix <> ":invalidate"

  def l2_key(cfg, key) do
    generation = :atomics.get(cfg.generation, 1)
    [cfg.prefix, ?:, Integer.to_string(generation), ?: | encode_key(key)] |> IO.iodata_to_binary()
  end

  # Binary keys stay readable in redis-cli; other terms are encoded
  # deterministically so equal keys map to one L2 key.
  defp encode_key(key) when is_binary(key), do: ["b:", key]
  defp encode_key(key), do: ["t:", :erlang.term_to_binary(key, [:deterministic])]

  def encode_value(value, level), do: :erlang.term_to_binary(value, compressed: level)

  # [:safe]: foreign bytes can create no atoms and no external funs; bytes
  # that do not decode are an error for the caller to count, never a raise.
  def decode_value(bin) do
    {:ok, :erlang.binary_to_term(bin, [:safe])}
  rescue
    ArgumentError -> :error
  end

  def encode_message(node_id, message),
    do: :erlang.term_to_binary({:larder_cache, node_id, message})

  def decode_message(bin) do
    case decode_value(bin) do
      {:ok, {:larder_cache, node_id, {:key, _} = message}} ->
        {:ok, node_id, message}

      {:ok, {:larder_cache, node_id, {:all, g} = message}} when is_integer(g) ->
        {:ok, node_id, message}

      _ ->
        :error
    end
  end
end
