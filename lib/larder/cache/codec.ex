# Encodes, and safely decodes, the values, invalidation messages and
# generation numbers that go to and come back from the L2 (all of them
# untrusted on the way back).
defmodule Larder.Cache.Codec do
  @moduledoc false

  alias Larder.Cache.ExternalTerm

  # Generations are kept in a signed 64-bit atomic and compared as integers;
  # anything outside 0..@max_generation in the generation key or in a
  # message is foreign and ignored. Redis's INCR stops at 2^63 - 1, so an
  # honest counter never gets near this bound.
  @max_generation 2 ** 62 - 1

  def max_generation, do: @max_generation

  def encode_value(value, level), do: :erlang.term_to_binary(value, compressed: level)

  @doc """
  Decodes L2 bytes into a term of at most `max` bytes (see ExternalTerm):
  `{:ok, term}` or `{:error, :corrupt | :too_large | :fun}`, never a raise.
  [:safe]: foreign bytes can create no atoms and no external funs.
  """
  def decode_value(bin, max) when is_binary(bin) do
    case ExternalTerm.check(bin, max) do
      {:ok, plain} -> {:ok, :erlang.binary_to_term(plain, [:safe])}
      {:error, _} = error -> error
    end
  rescue
    ArgumentError -> {:error, :corrupt}
  end

  def decode_value(_bin, _max), do: {:error, :corrupt}

  def encode_message(node_id, message),
    do: :erlang.term_to_binary({:larder_cache, node_id, message})

  @doc """
  Decodes an invalidation message: `{:ok, node_id, {:key, key}}`,
  `{:ok, node_id, {:all, generation}}` or `:error`. The node id is 16
  bytes, the generation an integer in 0..max_generation(), the payload at
  most `max` bytes and bounded like a value.
  """
  def decode_message(bin, max) do
    case decode_value(bin, max) do
      {:ok, {:larder_cache, <<_::binary-16>> = node_id, {:key, _} = message}} ->
        {:ok, node_id, message}

      {:ok, {:larder_cache, <<_::binary-16>> = node_id, {:all, g} = message}}
      when is_integer(g) and g >= 0 and g <= @max_generation ->
        {:ok, node_id, message}

      _ ->
        :error
    end
  end

  @doc """
  Parses the generation key's value or an INCR reply: decimal digits of an
  integer in 0..max_generation(), else `:error`.
  """
  def parse_generation(bin) when is_binary(bin) and byte_size(bin) in 1..19 do
    case Integer.parse(bin) do
      {g, ""} when g >= 0 and g <= @max_generation -> {:ok, g}
      _ -> :error
    end
  end

  def parse_generation(g) when is_integer(g) and g >= 0 and g <= @max_generation, do: {:ok, g}
  def parse_generation(_other), do: :error
end
