# Checks bytes in the external term format before they are decoded: walks
# them once, iteratively, to reject funs and to bound the heap the decoded
# term would take, so a small L2 value can never decode into a huge term.
defmodule Larder.Cache.ExternalTerm do
  @moduledoc false

  # The walk keeps one counter of terms still to read (the format is
  # prefix order: a tuple's tag says how many terms follow), so it needs no
  # stack and no recursion whatever the depth. `cost` is an upper bound, in
  # bytes, of what `binary_to_term/2` allocates for what was read so far:
  # heap words times 8, plus the bytes of off-heap binaries. Every length
  # field is matched against the bytes that are there, so a lying length is
  # `:corrupt`, and the cost is checked against `max` after every term, so
  # the walk stops as soon as the bound is passed.

  @word 8

  @doc """
  Checks `bin`, a whole external term (starting with 131, compressed or not).

  Returns `{:ok, plain}` where `plain` is the uncompressed term (starting
  with 131) to give to `binary_to_term/2`, or `{:error, :too_large | :fun |
  :corrupt}`. `max` bounds the input bytes, a compressed term's declared
  uncompressed size and the decoded term's estimated memory.
  """
  def check(bin, max) when byte_size(bin) > max, do: {:error, :too_large}

  def check(<<131, 80, size::32, _::binary>>, max) when size > max, do: {:error, :too_large}

  def check(<<131, 80, size::32, zdata::binary>>, max) do
    case inflate(zdata, size) do
      {:ok, plain} -> walk_checked(plain, max)
      :error -> {:error, :corrupt}
    end
  end

  def check(<<131, rest::binary>> = bin, max) do
    case walk(rest, 1, 0, max) do
      :ok -> {:ok, bin}
      error -> error
    end
  end

  def check(_bin, _max), do: {:error, :corrupt}

  defp walk_checked(plain, max) do
    case walk(plain, 1, 0, max) do
      :ok -> {:ok, <<131, plain::binary>>}
      error -> error
    end
  end

  # Inflates at most `size` bytes (+1 to notice a lie), chunk by chunk, so a
  # zip bomb stops at its declared size.
  defp inflate(zdata, size) do
    z = :zlib.open()

    try do
      :ok = :zlib.inflateInit(z)
      inflate_loop(z, :zlib.safeInflate(z, zdata), [], 0, size)
    catch
      _, _ -> :error
    after
      :zlib.close(z)
    end
  end

  defp inflate_loop(z, {status, out}, acc, got, size) when status in [:continue, :finished] do
    got = got + :erlang.iolist_size(out)

    cond do
      got > size -> :error
      status == :continue -> inflate_loop(z, :zlib.safeInflate(z, []), [acc | out], got, size)
      got == size -> {:ok, IO.iodata_to_binary([acc | out])}
      true -> :error
    end
  end

  defp inflate_loop(_z, _other, _acc, _got, _size), do: :error

  # walk(rest, pending, cost, max)
  defp walk(_rest, _pending, cost, max) when cost > max, do: {:error, :too_large}
  defp walk(_rest, 0, _cost, _max), do: :ok

  # SMALL_INTEGER_EXT, INTEGER_EXT: immediates
  defp walk(<<97, _, rest::binary>>, p, c, m), do: walk(rest, p - 1, c, m)
  defp walk(<<98, _::32, rest::binary>>, p, c, m), do: walk(rest, p - 1, c + 2 * @word, m)
  # NIL_EXT
  defp walk(<<106, rest::binary>>, p, c, m), do: walk(rest, p - 1, c, m)
  # NEW_FLOAT_EXT, FLOAT_EXT
  defp walk(<<70, _::64, rest::binary>>, p, c, m), do: walk(rest, p - 1, c + 2 * @word, m)
  defp walk(<<99, _::binary-31, rest::binary>>, p, c, m), do: walk(rest, p - 1, c + 2 * @word, m)

  # atoms (existing ones only: binary_to_term's :safe refuses new atoms)
  defp walk(<<tag, n, _::binary-size(n), rest::binary>>, p, c, m) when tag in [115, 119],
    do: walk(rest, p - 1, c, m)

  defp walk(<<tag, n::16, _::binary-size(n), rest::binary>>, p, c, m) when tag in [100, 118],
    do: walk(rest, p - 1, c, m)

  # SMALL_TUPLE_EXT, LARGE_TUPLE_EXT
  defp walk(<<104, n, rest::binary>>, p, c, m), do: walk(rest, p - 1 + n, c + (1 + n) * @word, m)

  defp walk(<<105, n::32, rest::binary>>, p, c, m),
    do: walk(rest, p - 1 + n, c + (1 + n) * @word, m)

  # STRING_EXT: a list of small integers, one cons cell per byte
  defp walk(<<107, n::16, _::binary-size(n), rest::binary>>, p, c, m),
    do: walk(rest, p - 1, c + 2 * n * @word, m)

  # LIST_EXT: n elements then the tail
  defp walk(<<108, n::32, rest::binary>>, p, c, m),
    do: walk(rest, p + n, c + 2 * n * @word, m)

  # BINARY_EXT, BIT_BINARY_EXT: the bytes plus a header or a ProcBin and a
  # sub-binary
  defp walk(<<109, n::32, _::binary-size(n), rest::binary>>, p, c, m),
    do: walk(rest, p - 1, c + n + 10 * @word, m)

  defp walk(<<77, n::32, _bits, _::binary-size(n), rest::binary>>, p, c, m),
    do: walk(rest, p - 1, c + n + 10 * @word, m)

  # SMALL_BIG_EXT, LARGE_BIG_EXT
  defp walk(<<110, n, _sign, _::binary-size(n), rest::binary>>, p, c, m),
    do: walk(rest, p - 1, c + n + 2 * @word, m)

  defp walk(<<111, n::32, _sign, _::binary-size(n), rest::binary>>, p, c, m),
    do: walk(rest, p - 1, c + n + 2 * @word, m)

  # MAP_EXT: n keys and n values; a large map is a HAMT, counted generously
  defp walk(<<116, n::32, rest::binary>>, p, c, m),
    do: walk(rest, p - 1 + 2 * n, c + (4 + 6 * n) * @word, m)

  # pids, ports, references: a node atom follows the tag, then fixed fields
  defp walk(<<tag, rest::binary>>, p, c, m) when tag in [88, 103, 89, 102, 120, 101] do
    # the node atom is the next term; the fixed fields come after it
    walk_after_atom(rest, fixed_bytes(tag), p, c + 8 * @word, m)
  end

  defp walk(<<tag, n::16, rest::binary>>, p, c, m) when tag in [90, 114] do
    walk_after_atom(rest, {tag, n}, p, c + (8 + n) * @word, m)
  end

  # NEW_FUN_EXT, FUN_EXT, EXPORT_EXT
  defp walk(<<tag, _::binary>>, _p, _c, _m) when tag in [112, 117, 113], do: {:error, :fun}

  defp walk(_rest, _p, _c, _m), do: {:error, :corrupt}

  defp fixed_bytes(88), do: 12
  defp fixed_bytes(103), do: 9
  defp fixed_bytes(89), do: 8
  defp fixed_bytes(102), do: 5
  defp fixed_bytes(120), do: 12
  defp fixed_bytes(101), do: 5

  defp walk_after_atom(rest, fixed, p, c, m) do
    case skip_atom(rest) do
      {:ok, rest} ->
        case skip_fixed(rest, fixed) do
          {:ok, rest} -> walk(rest, p - 1, c, m)
          :error -> {:error, :corrupt}
        end

      :error ->
        {:error, :corrupt}
    end
  end

  defp skip_atom(<<tag, n, _::binary-size(n), rest::binary>>) when tag in [115, 119],
    do: {:ok, rest}

  defp skip_atom(<<tag, n::16, _::binary-size(n), rest::binary>>) when tag in [100, 118],
    do: {:ok, rest}

  defp skip_atom(_), do: :error

  # NEWER_REFERENCE_EXT: 4-byte creation; NEW_REFERENCE_EXT: 1-byte creation
  defp skip_fixed(bin, {90, n}), do: skip_fixed(bin, 4 + 4 * n)
  defp skip_fixed(bin, {114, n}), do: skip_fixed(bin, 1 + 4 * n)

  defp skip_fixed(bin, n) when is_integer(n) do
    case bin do
      <<_::binary-size(n), rest::binary>> -> {:ok, rest}
      _ -> :error
    end
  end
end
