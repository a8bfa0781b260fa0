defmodule PriceSearch.Request do
  @moduledoc """
  Request bodies read as the Go reference service reads them: Go's
  `encoding/json` decoding a JSON value into the service's request structs.

  A search request is `{"offeringId","groupId","priceSpecId","charValues":
  [{"char","value"}...]}`, plus `"id"` (0..65535) in a bulk body. As in Go:

    * a missing or `null` string field is `""`, a `null` or missing
      `charValues` no characteristic, a `null` entry one with `""` for both;
    * keys match case-insensitively (`OfferingId`, `CHAR`) when no key
      matches exactly; a key given twice takes its last value (a `null`
      leaves the earlier one); unknown keys are ignored;
    * invalid UTF-8 and lone surrogate escapes in strings become U+FFFD;
    * a value of another JSON type is an error naming the field's path
      (`charValues.char`) and the byte after it, the first one in the body;
    * a single body is its first JSON value: whatever follows is ignored;
    * a bulk body is a stream of JSON values, with or without whitespace
      between them: it ends at the end of the body, or at a `]` or `}`
      where a value would start, and stops at the first value that cannot
      be read (bad syntax or a type error).

  Error messages are the Go service's, byte for byte (see `t:error/0`).

  One difference, where Go contradicts its own documentation: when a body
  gives `charValues` twice, Go decodes the second array into the first's
  memory, so an entry of the second that lacks `char` or `value` keeps the
  first's; here every entry starts empty, as Go documents.

  ## Performance

  A body goes through jiffy first; the exact reader (`PriceSearch.GoJSON`, in
  Elixir) runs only for what jiffy rejects or cannot tell apart: malformed
  JSON, invalid UTF-8, lone surrogates, a value of the wrong type, an
  explicit `"id": 0` (it may have been `-0`), a value over 10,000 bytes (it
  may nest deeper than Go allows).
  """

  alias PriceSearch.GoJSON

  @typedoc "A decoded search request."
  @type t :: %{
          offering: String.t(),
          group: String.t(),
          spec: String.t(),
          chars: [{String.t(), String.t()}],
          id: 0..65_535
        }

  @typedoc """
  Why a body could not be read, with the Go service's message:

    * `"Request body must not be empty"` (only whitespace);
    * `"Request body contains badly-formed JSON"` (the body ends inside a value);
    * `"Request body contains badly-formed JSON (at position N)"`;
    * `"Request body contains an invalid Value for the \\"F\\" field (at position N)"`.
  """
  @type error :: String.t()

  @empty %{offering: "", group: "", spec: "", chars: [], id: 0}

  @doc """
  Reads a single search body: its first JSON value.

  `reader` is `:auto` (jiffy first, see "Performance") or `:exact` (only
  the exact reader: the same answer, slower; tests compare the two).
  """
  @spec single(binary(), :auto | :exact) :: {:ok, t()} | {:error, error()}
  def single(body, reader \\ :auto)
  def single(body, :exact), do: slow_single(body)

  def single(body, :auto) do
    case fast(body, :single) do
      {:ok, request, _rest} -> {:ok, request}
      :slow -> slow_single(body)
    end
  end

  @doc """
  Reads a bulk body: the requests in order, and `:error` when a value could
  not be read (the requests before it still count), as Go's stream decoder
  does; `{:too_many, max}` when it holds more than `max` requests.
  `reader` as for `single/2`.
  """
  @spec bulk(binary(), pos_integer(), :auto | :exact) ::
          {:ok | :error, [t()]} | {:too_many, pos_integer()}
  def bulk(body, max \\ 65_536, reader \\ :auto) do
    case stream(body, max, reader, 0, []) do
      {:stopped, requests} -> {:ok, requests}
      other -> other
    end
  end

  @doc """
  Reads a slice of a bulk body cut just after a newline, as `bulk/2` reads
  it: `{:whole, requests}` when the slice holds whole values only and nothing
  but blanks after the last, so that reading the body from the slice's end
  goes on exactly as reading it all would (a JSON value holds no raw
  newline but between its tokens, and its tokens end where the slice does);
  otherwise what `bulk/2` answers for the slice alone, with `{:stopped,
  requests}` for a stream ended by a stray `]` or `}`.
  """
  @spec bulk_slice(binary(), pos_integer()) ::
          {:whole | :stopped | :error, [t()]} | {:too_many, pos_integer()}
  def bulk_slice(slice, max) do
    case stream(slice, max, :auto, 0, []) do
      {:ok, requests} -> {:whole, requests}
      other -> other
    end
  end

  defp stream(rest, max, reader, count, acc) do
    case GoJSON.skip_ws(rest, 0) do
      {"", _} ->
        {:ok, :lists.reverse(acc)}

      # Go's Decoder.More: a stray closing bracket ends the stream.
      {<<c, _::binary>>, _} when c in ~c"]}" ->
        {:stopped, :lists.reverse(acc)}

      _ when count == max ->
        {:too_many, max}

      {rest, _} ->
        case if(reader == :auto, do: fast(rest, :bulk), else: :slow) do
          {:ok, request, rest} ->
            stream(rest, max, reader, count + 1, [request | acc])

          :slow ->
            with {:ok, tree, rest, _pos} <- GoJSON.value(rest, 0),
                 {:ok, request} <- from_tree(tree, :bulk) do
              stream(rest, max, reader, count + 1, [request | acc])
            else
              _ -> {:error, :lists.reverse(acc)}
            end
        end
    end
  end

  ## The exact path

  defp slow_single(body) do
    case GoJSON.value(body, 0) do
      {:ok, tree, _rest, _pos} ->
        case from_tree(tree, :single) do
          {:ok, request} -> {:ok, request}
          {:error, {field, at}} -> {:error, type_error(field, at)}
        end

      {:error, :empty} ->
        {:error, "Request body must not be empty"}

      {:error, :unexpected_eof} ->
        {:error, "Request body contains badly-formed JSON"}

      {:error, {:syntax, at}} ->
        {:error, "Request body contains badly-formed JSON (at position #{at})"}
    end
  end

  defp type_error(field, at),
    do: "Request body contains an invalid Value for the \"#{field}\" field (at position #{at})"

  # Go's unmarshal into the request struct; the first type error wins.
  defp from_tree({:obj, _, pairs}, kind), do: tree_fields(pairs, kind, @empty)
  defp from_tree({:null, _}, _kind), do: {:ok, @empty}
  defp from_tree(tree, _kind), do: {:error, {"", at(tree)}}

  defp tree_fields([], _kind, request), do: {:ok, request}

  defp tree_fields([{key, value} | rest], kind, request) do
    case tree_field(field(key, kind), value, request) do
      {:ok, request} -> tree_fields(rest, kind, request)
      error -> error
    end
  end

  defp tree_field(nil, _value, request), do: {:ok, request}
  defp tree_field(:chars, {:null, _}, request), do: {:ok, %{request | chars: []}}
  defp tree_field(_field, {:null, _}, request), do: {:ok, request}

  defp tree_field(:chars, {:arr, _, entries}, request) do
    case tree_chars(entries, []) do
      {:ok, chars} -> {:ok, %{request | chars: chars}}
      error -> error
    end
  end

  defp tree_field(:id, {:num, at, literal}, request) do
    case Integer.parse(literal) do
      {id, ""} when id in 0..65_535 and binary_part(literal, 0, 1) != "-" ->
        {:ok, %{request | id: id}}

      _ ->
        {:error, {"id", at}}
    end
  end

  defp tree_field(field, {:str, _, string}, request) when field not in [:chars, :id],
    do: {:ok, Map.put(request, field, string)}

  defp tree_field(field, tree, _request), do: {:error, {name(field), at(tree)}}

  defp tree_chars([], acc), do: {:ok, :lists.reverse(acc)}

  defp tree_chars([{:obj, _, pairs} | rest], acc) do
    case tree_char(pairs, {"", ""}) do
      {:ok, cv} -> tree_chars(rest, [cv | acc])
      error -> error
    end
  end

  defp tree_chars([{:null, _} | rest], acc), do: tree_chars(rest, [{"", ""} | acc])
  defp tree_chars([tree | _], _acc), do: {:error, {"charValues", at(tree)}}

  defp tree_char([], cv), do: {:ok, cv}

  defp tree_char([{key, value} | rest], {c, v} = cv) do
    case {char_field(key), value} do
      {nil, _} -> tree_char(rest, cv)
      {_, {:null, _}} -> tree_char(rest, cv)
      {:char, {:str, _, s}} -> tree_char(rest, {s, v})
      {:value, {:str, _, s}} -> tree_char(rest, {c, s})
      {field, tree} -> {:error, {"charValues.#{field}", at(tree)}}
    end
  end

  # Where Go reports a type error: after a scalar, after an array's or
  # object's opening bracket.
  defp at({kind, open, _}) when kind in [:arr, :obj], do: open + 1
  defp at({_kind, end_pos, _}), do: end_pos
  defp at({_kind, end_pos}), do: end_pos

  ## The fast path: jiffy, when its answer is surely Go's

  # Values longer than this may nest deeper than Go's 10,000 levels.
  @fast_max 10_000

  defp fast(bin, kind) do
    {term, rest} =
      case :jiffy.decode(bin, [:return_trailer]) do
        {:has_trailer, term, rest} -> {term, rest}
        term -> {term, ""}
      end

    if byte_size(bin) - byte_size(rest) > @fast_max do
      :slow
    else
      case from_jiffy(term, kind) do
        {:ok, request} -> {:ok, request, rest}
        :slow -> :slow
      end
    end
  catch
    _, _ -> :slow
  end

  defp from_jiffy({pairs}, kind), do: jiffy_fields(pairs, kind, @empty)
  defp from_jiffy(:null, _kind), do: {:ok, @empty}
  defp from_jiffy(_term, _kind), do: :slow

  defp jiffy_fields([], _kind, request), do: {:ok, request}

  defp jiffy_fields([{key, value} | rest], kind, request) do
    case jiffy_field(field(key, kind), value, request) do
      {:ok, request} -> jiffy_fields(rest, kind, request)
      :slow -> :slow
    end
  end

  defp jiffy_field(nil, _value, request), do: {:ok, request}
  defp jiffy_field(:chars, :null, request), do: {:ok, %{request | chars: []}}
  defp jiffy_field(_field, :null, request), do: {:ok, request}

  defp jiffy_field(:chars, list, request) when is_list(list) do
    case jiffy_chars(list, []) do
      {:ok, chars} -> {:ok, %{request | chars: chars}}
      :slow -> :slow
    end
  end

  # An explicit 0 may have been written -0, which Go refuses.
  defp jiffy_field(:id, id, request) when is_integer(id) and id in 1..65_535,
    do: {:ok, %{request | id: id}}

  defp jiffy_field(field, string, request) when is_binary(string) and field not in [:chars, :id],
    do: {:ok, Map.put(request, field, string)}

  defp jiffy_field(_field, _value, _request), do: :slow

  defp jiffy_chars([], acc), do: {:ok, :lists.reverse(acc)}

  defp jiffy_chars([{pairs} | rest], acc) do
    case jiffy_char(pairs, {"", ""}) do
      {:ok, cv} -> jiffy_chars(rest, [cv | acc])
      :slow -> :slow
    end
  end

  defp jiffy_chars([:null | rest], acc), do: jiffy_chars(rest, [{"", ""} | acc])
  defp jiffy_chars(_, _acc), do: :slow

  defp jiffy_char([], cv), do: {:ok, cv}

  defp jiffy_char([{key, value} | rest], {c, v} = cv) do
    case {char_field(key), value} do
      {nil, _} -> jiffy_char(rest, cv)
      {_, :null} -> jiffy_char(rest, cv)
      {:char, s} when is_binary(s) -> jiffy_char(rest, {s, v})
      {:value, s} when is_binary(s) -> jiffy_char(rest, {c, s})
      _ -> :slow
    end
  end

  ## Keys: an exact match, else Go's case folding

  defp field("offeringId", _kind), do: :offering
  defp field("groupId", _kind), do: :group
  defp field("priceSpecId", _kind), do: :spec
  defp field("charValues", _kind), do: :chars
  defp field("id", :bulk), do: :id

  defp field(key, kind) do
    case {fold(key), kind} do
      {"OFFERINGID", _} -> :offering
      {"GROUPID", _} -> :group
      {"PRICESPECID", _} -> :spec
      {"CHARVALUES", _} -> :chars
      {"ID", :bulk} -> :id
      _ -> nil
    end
  end

  defp char_field("char"), do: :char
  defp char_field("value"), do: :value

  defp char_field(key) do
    case fold(key) do
      "CHAR" -> :char
      "VALUE" -> :value
      _ -> nil
    end
  end

  defp name(:offering), do: "offeringId"
  defp name(:group), do: "groupId"
  defp name(:spec), do: "priceSpecId"
  defp name(:chars), do: "charValues"
  defp name(:id), do: "id"

  # Go's foldName for keys that can equal an ASCII field name: ASCII letters
  # upper-cased, and the two non-ASCII letters that fold to ASCII ones (the
  # Kelvin sign K, the long s ſ). Longer keys cannot match.
  defp fold(key) when byte_size(key) > 33, do: key
  defp fold(key), do: fold(key, <<>>)

  defp fold(<<c, rest::binary>>, acc) when c in ?a..?z, do: fold(rest, <<acc::binary, c - 32>>)
  defp fold(<<"\u212A", rest::binary>>, acc), do: fold(rest, <<acc::binary, ?K>>)
  defp fold(<<"\u017F", rest::binary>>, acc), do: fold(rest, <<acc::binary, ?S>>)
  defp fold(<<c, rest::binary>>, acc), do: fold(rest, <<acc::binary, c>>)
  defp fold(<<>>, acc), do: acc
end
