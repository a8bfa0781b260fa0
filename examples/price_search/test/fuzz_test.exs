defmodule PriceSearch.FuzzTest do
  # Random bodies against the application's listener: random bytes, and
  # random JSON shapes (built around the request's own field names, so they
  # reach the field checks). Seeded, so a failure replays. Not async: it
  # shares the listener with the HTTP suite.
  use ExUnit.Case

  alias PriceSearch.TestClient, as: C

  @seed 20_261_122
  @bodies 300
  @paths ['/v1/search/bitmap/prices', '/v1/search/map/prices', '/v5/search/bitmap/bulk/prices']
  @fields ~w(offeringId groupId priceSpecId charValues char value id)

  setup_all do
    :ok = :httpc.set_options(max_sessions: 64, max_keep_alive_length: 100)
    port = PriceSearch.port()
    :ok = C.await_loaded(port)
    %{port: port}
  end

  test "random bodies are each answered with a 4xx and the service keeps serving", %{port: port} do
    rand = :rand.seed_s(:exsss, @seed)

    {_, answers} =
      Enum.reduce(1..@bodies, {rand, []}, fn i, {rand, acc} ->
        {body, rand} = body(rand)
        path = Enum.at(@paths, rem(i, 3))
        {status, _, answer} = C.post(port, path, body)
        {rand, [{path, body, status, answer} | acc]}
      end)

    for {path, body, status, answer} <- answers do
      assert allowed?(path, status, answer),
             "#{path} answered #{status} #{inspect(answer)} to #{inspect(body, limit: 200)}"
    end

    assert {200, _, ""} = C.get(port, '/health')

    assert {404, _, _} =
             C.post(
               port,
               '/v1/search/bitmap/prices',
               ~s({"offeringId":"a","groupId":"b","priceSpecId":"c"})
             )
  end

  # A 4xx always. A bulk body that starts with a readable value is a 200,
  # with an error line per request read (random values match no price), and
  # "Unable decode body" last if a value could not be read, as Go answers.
  defp allowed?('/v5/search/bitmap/bulk/prices', 200, answer) do
    lines = String.split(answer, "\n", trim: true)
    lines = if List.last(lines) == "Unable decode body", do: Enum.drop(lines, -1), else: lines

    Enum.all?(
      lines,
      &match?(%{"error" => %{"message" => _}, "id" => _}, :jiffy.decode(&1, [:return_maps]))
    )
  end

  defp allowed?(_path, status, _answer), do: status in 400..499

  defp body(rand) do
    {kind, rand} = :rand.uniform_s(4, rand)

    case kind do
      1 ->
        {n, rand} = :rand.uniform_s(200, rand)
        :rand.bytes_s(n, rand)

      2 ->
        {json, rand} = json(rand, 4)
        {:jiffy.encode(json), rand}

      3 ->
        {json, rand} = request_like(rand)
        {:jiffy.encode(json), rand}

      4 ->
        # NDJSON: several request-like lines, some with an id.
        {n, rand} = :rand.uniform_s(5, rand)

        {lines, rand} =
          Enum.map_reduce(1..n, rand, fn _, rand ->
            {json, rand} = request_like(rand)
            {id, rand} = json(rand, 0)
            {:jiffy.encode(Map.put(json, "id", id)), rand}
          end)

        {Enum.join(lines, "\n"), rand}
    end
  end

  # An object with some of the request's fields, each a random JSON value.
  defp request_like(rand) do
    {n, rand} = :rand.uniform_s(length(@fields), rand)

    Enum.reduce(1..n, {%{}, rand}, fn _, {map, rand} ->
      {i, rand} = :rand.uniform_s(length(@fields), rand)
      {value, rand} = json(rand, 2)
      {Map.put(map, Enum.at(@fields, i - 1), value), rand}
    end)
  end

  # A random JSON value nested at most `depth` deep.
  defp json(rand, depth) do
    {kind, rand} = :rand.uniform_s(if(depth > 0, do: 8, else: 6), rand)

    case kind do
      1 -> {nil, rand}
      2 -> {true, rand}
      3 -> :rand.uniform_s(200_000, rand) |> then(fn {n, r} -> {n - 100_000, r} end)
      4 -> :rand.uniform_s(rand) |> then(fn {f, r} -> {f * 1.0e6, r} end)
      5 -> string(rand)
      6 -> string(rand)
      7 -> list(rand, depth - 1)
      8 -> object(rand, depth - 1)
    end
  end

  defp string(rand) do
    {n, rand} = :rand.uniform_s(12, rand)
    {bytes, rand} = :rand.bytes_s(n, rand)
    {Base.encode64(bytes), rand}
  end

  defp list(rand, depth) do
    {n, rand} = :rand.uniform_s(4, rand)
    Enum.map_reduce(1..n, rand, fn _, rand -> json(rand, depth) end)
  end

  defp object(rand, depth) do
    {n, rand} = :rand.uniform_s(4, rand)

    Enum.reduce(1..n, {%{}, rand}, fn _, {map, rand} ->
      {i, rand} = :rand.uniform_s(length(@fields) + 2, rand)
      key = Enum.at(@fields ++ ["x", "char"], i - 1)
      {value, rand} = json(rand, depth)
      {Map.put(map, key, value), rand}
    end)
  end
end
