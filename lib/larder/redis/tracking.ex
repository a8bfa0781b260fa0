# Server-assisted invalidation (CLIENT TRACKING in BCAST mode, RESP2
# redirect) as a client feature: the tracking channel and the client id,
# CLIENT TRACKING on every command connection, redirected to the pub/sub
# connection, the keys of an invalidation message, the check that finds a
# command connection that replaced one that failed, whether tracking is on
# at all, and a probe of a server that may refuse it.
defmodule Larder.Redis.Tracking do
  @moduledoc false

  # Contract (internal).
  #
  # The manager of a pool of Larder.Redis.Connection processes (a
  # Larder.Redis.Pool) and of one Larder.Redis.PubSub keeps the t() of
  # new/1 in its state. Its subscription sends CLIENT ID and subscribes to
  # channel/0 too; parse_id/1 checks the CLIENT ID reply; enable_all/4 then
  # turns tracking on for every command connection, redirected to that
  # id, and check/3 (called on a timer)
  # turns it on for the connections that replaced failed ones, telling the
  # owner when none kept it (writes of that time may have gone unreported).
  # Tracking is on (on?/1) while at least one command connection tracks,
  # redirected to the subscription's id: with BCAST each one reports every
  # write under the prefix. It is refused when no connection tracks and
  # Redis answered CLIENT TRACKING with an error (an ACL without it, a
  # Redis before 6): enable_all/4 and check/3 say so, so that the owner
  # keeps nothing nobody invalidates. probe/6 tries the commands tracking
  # and the subscription need on a connection of its own (at the owner's
  # first start).
  #
  # Untrusted: anyone may PUBLISH on the tracking channel. keys/1 turns a
  # message's payload into the invalidated keys, :all (Redis's nil after
  # FLUSHDB or FLUSHALL) or :bad (anything else); what an invalidation
  # means to the keys the owner holds is the owner's own.
  #
  # Bounds: every CLIENT TRACKING call is bounded by the `timeout` given,
  # the calls run in parallel, one task per connection; a connection that
  # refuses is retried by check/3 (every 100 ms).

  alias Larder.Redis.{Connection, Socket}

  # Redis sends tracking invalidations to a RESP2 redirect target as
  # messages on this channel: an array of keys, or nil after FLUSHDB or
  # FLUSHALL.
  @channel "__redis__:invalidate"
  # A client id is a 64-bit integer.
  @max_id_digits 20

  @type t ::
          nil
          | %{
              prefix: binary(),
              id: binary() | nil,
              ports: %{pid() => port() | nil},
              refused: binary() | nil
            }

  def channel, do: @channel

  @doc "The owner's tracking state: nil when it does not track."
  @spec new(binary() | nil) :: t()
  def new(nil), do: nil

  def new(prefix) when is_binary(prefix),
    do: %{prefix: prefix, id: nil, ports: %{}, refused: nil}

  @doc "The `CLIENT ID` reply: `{:ok, id}` (decimal digits) or `:error`."
  @spec parse_id(term()) :: {:ok, binary()} | :error
  def parse_id(id) when is_binary(id) and byte_size(id) in 1..@max_id_digits do
    case Integer.parse(id) do
      {n, ""} when n > 0 -> {:ok, id}
      _ -> :error
    end
  end

  def parse_id(_other), do: :error

  @doc """
  The keys a message on the tracking channel invalidates: a list of
  binaries, `:all` (nil, after FLUSHDB or FLUSHALL) or `:bad` (untrusted:
  anyone may PUBLISH there, and then the payload is a binary, never the
  array Redis sends).
  """
  @spec keys(term()) :: [binary()] | :all | :bad
  def keys(:undefined), do: :all

  def keys(keys) when is_list(keys) do
    if Enum.all?(keys, &is_binary/1), do: keys, else: :bad
  end

  def keys(_other), do: :bad

  @doc """
  Turns tracking on, redirected to the subscriber's new `id`, on every data
  connection (a map of client pids), in parallel and within `timeout` ms.
  A connection that did not answer OK is retried by `check/3`. Returns
  `{tracking, status}`: `:on` (at least one connection tracks), `{:refused,
  reply}` (none does, and Redis refused with `reply`) or `:off` (none does
  yet: no connection, or none answered in time).
  """
  @spec enable_all(t(), binary(), map(), pos_integer()) ::
          {t(), :on | :off | {:refused, binary()}}
  def enable_all(tracking, id, clients, timeout) do
    tracking = enable(%{tracking | id: id, ports: %{}}, Map.keys(clients), timeout)
    {tracking, status(tracking, clients)}
  end

  @doc """
  Finds the data connections whose socket changed since tracking was turned
  on for them (a new connection), and turns it on for them. Returns
  `{tracking, event}`: `:up` when tracking is on again after a time when no
  data connection had it (writes of that time may have gone unreported: an
  owner that holds copies of keys drops them, as on a resubscription),
  `{:refused, reply}` when no connection has it and Redis refused it, or
  nil.
  """
  @spec check(t(), map(), pos_integer()) :: {t(), nil | :up | {:refused, binary()}}
  def check(%{id: id} = tracking, clients, timeout) when id != nil do
    current = Map.new(Map.keys(clients), &{&1, socket(&1)})
    stale = for {pid, port} <- current, port != nil, tracking.ports[pid] != port, do: pid

    if stale == [] do
      {tracking, nil}
    else
      kept? =
        Enum.any?(current, fn {pid, port} -> port != nil and tracking.ports[pid] == port end)

      ports = Map.take(tracking.ports, Map.keys(clients))
      tracking = enable(%{tracking | ports: ports}, stale, timeout)

      case status(tracking, clients) do
        :on when not kept? -> {tracking, :up}
        {:refused, _reply} = refused -> {tracking, refused}
        _on_kept_or_off -> {tracking, nil}
      end
    end
  end

  def check(tracking, _clients, _timeout), do: {tracking, nil}

  @doc """
  `:on` while at least one of `clients` tracks (on the socket tracking was
  turned on for); else `{:refused, reply}` if Redis refused the last
  attempt, or `:off`.
  """
  @spec status(t(), map()) :: :on | :off | {:refused, binary()}
  def status(tracking, clients) do
    on? =
      Enum.any?(Map.keys(clients), fn pid ->
        port = tracking.ports[pid]
        port != nil and port == socket(pid)
      end)

    cond do
      on? -> :on
      tracking.refused -> {:refused, tracking.refused}
      true -> :off
    end
  end

  @doc """
  Tries, on a connection of its own to `host` and `port` (with the
  handshake `auth`), what a subscriber's invalidation needs, all within
  `timeout` ms: with a tracking `prefix`, `CLIENT ID` and `CLIENT
  TRACKING on BCAST` with the prefix (then off again); then `subscribe`,
  the subscription's commands (each of one channel: one reply each).
  `:ok`, `{:refused, command, reply}` for the first that Redis refused
  (its first two words), or `{:error, reason}` when it could not tell (no
  connection, a refused AUTH, no answer).
  """
  @spec probe(
          String.t() | charlist(),
          1..65_535,
          [[binary()]],
          binary() | nil,
          [[binary()]],
          pos_integer()
        ) ::
          :ok | {:refused, binary(), binary()} | {:error, term()}
  def probe(host, port, auth, prefix, subscribe, timeout) do
    tracking =
      case prefix do
        nil ->
          []

        prefix ->
          prefix = if prefix == "", do: [], else: ["PREFIX", prefix]

          [
            ["CLIENT", "ID"],
            ["CLIENT", "TRACKING", "on", "BCAST" | prefix],
            ["CLIENT", "TRACKING", "off"]
          ]
      end

    commands = tracking ++ subscribe

    case Socket.request(host, port, commands, timeout: timeout, handshake: auth) do
      {:ok, replies} ->
        refused =
          Enum.zip(commands, replies)
          |> Enum.find(&match?({_command, {:error, text}} when is_binary(text), &1))

        case refused do
          nil -> :ok
          {command, {:error, text}} -> {:refused, command_name(command), text}
        end

      {:error, reason} ->
        {:error, reason}
    end
  end

  defp command_name(["CLIENT", sub | _]), do: "CLIENT " <> sub
  defp command_name([name | _]), do: name

  defp enable(tracking, pids, timeout) do
    # (an empty prefix: every key)
    prefix = if tracking.prefix == "", do: [], else: ["PREFIX", tracking.prefix]
    on = ["CLIENT", "TRACKING", "on", "REDIRECT", tracking.id, "BCAST" | prefix]
    # (re-enabling with a new redirect needs it off first: Redis refuses a
    # prefix the connection already tracks)
    commands = [["CLIENT", "TRACKING", "off"], on]

    results =
      pids
      |> Task.async_stream(
        fn pid ->
          port = socket(pid)

          case safe_qp(pid, commands, timeout) do
            [{:ok, "OK"}, {:ok, "OK"}] -> {pid, port, nil}
            # an error reply: Redis refuses tracking (not a lost connection)
            [_, {:error, error}] when is_binary(error) -> {pid, nil, error}
            _failed -> {pid, nil, nil}
          end
        end,
        timeout: timeout + 100,
        on_timeout: :kill_task,
        max_concurrency: max(length(pids), 1)
      )
      |> Enum.flat_map(fn
        {:ok, result} -> [result]
        {:exit, _} -> []
      end)

    ports = Enum.into(results, tracking.ports, fn {pid, port, _error} -> {pid, port} end)

    # the refusal of this attempt, if Redis refused (nil: none, or not an answer)
    refused = Enum.find_value(results, fn {_pid, _port, error} -> error end)
    %{tracking | ports: ports, refused: refused}
  catch
    :exit, _ -> tracking
  end

  defp safe_qp(pid, commands, timeout), do: Connection.qp(pid, commands, timeout)

  # The socket of a connection (linked to it, its owner), or nil.
  defp socket(pid) do
    case Process.info(pid, :links) do
      {:links, links} -> Enum.find(links, &is_port/1)
      nil -> nil
    end
  end
end
