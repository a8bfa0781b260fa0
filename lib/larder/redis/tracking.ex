# Server-assisted invalidation (CLIENT TRACKING in BCAST mode, RESP2
# redirect) as a client feature: the pub/sub connection's extra handshake,
# CLIENT TRACKING on every command connection, redirected to the pub/sub
# connection, the keys of an invalidation message, and the check that
# finds a command connection that replaced one that failed.
defmodule Larder.Redis.Tracking do
  @moduledoc false

  # Contract (internal).
  #
  # The owner of a pool of Larder.Redis.Connection processes and of one
  # Larder.Redis.Subscription keeps the t() of new/1 in its state. Its
  # subscription sends handshake/2's commands; parse_id/1 checks the
  # CLIENT ID reply; enable_all/4 then turns tracking on for every command
  # connection, redirected to that id, and check/3 (called on a timer)
  # turns it on for the connections that replaced failed ones, telling the
  # owner when none kept it (writes of that time may have gone unreported).
  #
  # Untrusted: anyone may PUBLISH on the tracking channel. keys/1 turns a
  # message's payload into the invalidated keys, :all (Redis's nil after
  # FLUSHDB or FLUSHALL) or :bad (anything else); what an invalidation
  # means to the keys the owner holds is the owner's own.
  #
  # Bounds: every CLIENT TRACKING call is bounded by the `timeout` given,
  # the calls run in parallel, one task per connection; a connection that
  # refuses is logged once per run of refusals and retried by check/3.

  require Logger

  alias Larder.Redis.Connection

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
              failing: boolean()
            }

  def channel, do: @channel

  @doc "The owner's tracking state: nil when it does not track."
  @spec new(binary() | nil) :: t()
  def new(nil), do: nil

  def new(prefix) when is_binary(prefix),
    do: %{prefix: prefix, id: nil, ports: %{}, failing: false}

  @doc """
  What the pub/sub connection sends besides AUTH, and the replies it
  expects: `CLIENT ID` before the subscription, and a subscription to the
  tracking channel along with the owner's `channel`.
  """
  @spec handshake(t(), binary()) :: {[[binary()]], [atom()]}
  def handshake(nil, channel), do: {[["SUBSCRIBE", channel]], [:subscribe]}

  def handshake(_tracking, channel),
    do:
      {[["CLIENT", "ID"], ["SUBSCRIBE", channel, @channel]], [:client_id, :subscribe, :tracking]}

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
  A connection that did not answer OK is retried by `check/3`.
  """
  @spec enable_all(t(), binary(), map(), pos_integer()) :: t()
  def enable_all(tracking, id, clients, timeout) do
    tracking = %{tracking | id: id, ports: %{}}
    enable(tracking, Map.keys(clients), timeout)
  end

  @doc """
  Finds the data connections whose socket changed since tracking was turned
  on for them (a new connection), and turns it on for
  them. Returns `{tracking, gap?}`: `gap?` when no data connection kept its
  tracking meanwhile, so that writes of that time may have gone unreported
  (an owner that holds copies of keys drops them, as on a resubscription).
  """
  @spec check(t(), map(), pos_integer()) :: {t(), boolean()}
  def check(%{id: id} = tracking, clients, timeout) when id != nil do
    current = Map.new(Map.keys(clients), &{&1, socket(&1)})
    stale = for {pid, port} <- current, port != nil, tracking.ports[pid] != port, do: pid

    if stale == [] do
      {tracking, false}
    else
      kept? =
        Enum.any?(current, fn {pid, port} -> port != nil and tracking.ports[pid] == port end)

      ports = Map.take(tracking.ports, Map.keys(clients))
      tracking = enable(%{tracking | ports: ports}, stale, timeout)
      {tracking, not kept?}
    end
  end

  def check(tracking, _clients, _timeout), do: {tracking, false}

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
    refused = for {_pid, _port, error} <- results, error != nil, do: error

    cond do
      refused == [] ->
        %{tracking | ports: ports, failing: false}

      tracking.failing ->
        %{tracking | ports: ports}

      true ->
        Logger.warning(
          "Larder.Redis: CLIENT TRACKING refused (#{inspect(hd(refused))}); " <>
            "trying again every 100 ms"
        )

        %{tracking | ports: ports, failing: true}
    end
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
