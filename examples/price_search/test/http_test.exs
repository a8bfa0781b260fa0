defmodule PriceSearch.HTTPTest do
  # Not async: every test talks to the application's one listener.
  use ExUnit.Case

  alias PriceCatalogue, as: Catalogue
  alias PriceSearch.TestClient, as: C

  @bitmap '/v1/search/bitmap/prices'
  @map '/v1/search/map/prices'
  @bulk '/v5/search/bitmap/bulk/prices'

  setup_all do
    :ok = :httpc.set_options(max_sessions: 64, max_keep_alive_length: 100)
    port = PriceSearch.port()
    :ok = C.await_loaded(port)

    # The catalogue the service loaded, and each request's answer by a plain
    # filter over it (the offering's prices, then every condition checked).
    {source, prices, requests} = Catalogue.reference_or_generated()
    by_offering = Enum.group_by(prices, & &1.offering_id)

    expected = fn conditions ->
      [price] = Catalogue.filter(by_offering[conditions[:offering_id]], conditions)
      {encode(Catalogue.request_json(conditions)), price}
    end

    # A request without its Term: several prices match (none is a default).
    several =
      Enum.find_value(requests, fn conditions ->
        conditions = Enum.reject(conditions, &match?({:char, {"Term", _}}, &1))
        n = length(Catalogue.filter(by_offering[conditions[:offering_id]], conditions))
        if n >= 2, do: {encode(Catalogue.request_json(conditions)), n}
      end)

    %{
      port: port,
      source: source,
      several: several,
      requests: Enum.map(requests, expected),
      single: expected.(Catalogue.single_request(prices, source))
    }
  end

  defp encode(json), do: :jiffy.encode(json)

  defp price_body(p),
    do: ~s({"id":"#{p.idx}","spec":"#{p.spec}","value":#{p.value},"currency":"#{p.currency}"}\n)

  test "each of the 100 reference requests gets its price", %{port: port, requests: requests} do
    assert length(requests) == 100

    for {body, price} <- requests do
      assert {200, headers, answer} = C.post(port, @bitmap, body)
      assert answer == price_body(price)
      assert headers["content-type"] == "application/json"
    end
  end

  test "the single request", %{port: port, single: {body, price}} do
    assert {200, _, answer} = C.post(port, @bitmap, body)
    assert answer == price_body(price)

    assert %{"id" => _, "spec" => _, "value" => value, "currency" => _} =
             :jiffy.decode(answer, [:return_maps])

    assert value == price.value
  end

  test "the map endpoint answers as the bitmap endpoint on all 100 requests", %{
    port: port,
    requests: requests
  } do
    for {body, price} <- requests do
      assert {200, _, bitmap} = C.post(port, @bitmap, body)
      assert {200, _, map} = C.post(port, @map, body)
      assert map == bitmap
      assert map == price_body(price)
    end

    # Errors: the map endpoint says only "unable find price", as Go's does.
    unknown = encode(%{"offeringId" => "nope", "groupId" => "group1", "priceSpecId" => "MRC"})
    assert {404, _, "unable find price\n"} = C.post(port, @map, unknown)
    assert {404, _, "unable find offeringId in index\n"} = C.post(port, @bitmap, unknown)
  end

  test "an omitted characteristic is not checked; several matches without a default are an error",
       %{port: port, several: {body, n}} do
    assert {404, _, message} = C.post(port, @bitmap, body)
    assert n >= 2
    assert message == "unable find price, no default and >1 found\n"
    assert {404, _, ^message} = C.post(port, @map, body)
  end

  test "bulk: good and bad lines, each answered on its own line, chunked", %{
    port: port,
    requests: requests
  } do
    good =
      for {{body, _price}, id} <- Enum.with_index(requests) do
        encode(Map.put(:jiffy.decode(body, [:return_maps]), "id", id))
      end

    [{first, _} | _] = requests
    first = :jiffy.decode(first, [:return_maps])

    bad = [
      encode(Map.merge(first, %{"id" => 60_000, "groupId" => ""})),
      encode(Map.merge(first, %{"id" => 60_001, "offeringId" => "no-such-offering"})),
      encode(first |> Map.delete("priceSpecId") |> Map.put("id", 60_002)),
      encode(Map.merge(first, %{"id" => 60_003, "charValues" => [%{"char" => "Term"}]}))
    ]

    body =
      Enum.join(Enum.take(good, 50) ++ bad ++ ["", "\r"] ++ Enum.drop(good, 50), "\n") <> "\n"

    assert {200, headers, answer} = C.post(port, @bulk, body, 'application/x-ndjson')
    # httpc takes the chunks apart; the raw response shows them.
    assert headers["content-type"] == "application/x-ndjson"

    assert raw_post(port, @bulk, Enum.at(good, 0)) =~
             ~r/^HTTP\/1.1 200 OK\r\n.*Transfer-Encoding: chunked\r\n/s

    lines =
      answer |> String.split("\n", trim: true) |> Enum.map(&:jiffy.decode(&1, [:return_maps]))

    assert length(lines) == 104
    by_id = Map.new(lines, &{&1["id"], &1})

    for {{_body, price}, id} <- Enum.with_index(requests) do
      assert %{"price" => %{"id" => pid, "value" => value}} = by_id[id]
      assert {pid, value} == {Integer.to_string(price.idx), price.value}
    end

    assert by_id[60_000]["error"]["message"] == "unable find groupId in index"
    assert by_id[60_001]["error"]["message"] == "unable find offeringId in index"
    assert by_id[60_002]["error"]["message"] == "unable find specId in index"
    assert by_id[60_003]["error"]["message"] == "unable to find charValue in index"

    # In request order; field order of a line, as the Go service writes it.
    assert Enum.map(lines, & &1["id"]) ==
             Enum.to_list(0..49) ++ Enum.to_list(60_000..60_003) ++ Enum.to_list(50..99)

    assert answer =~
             ~r/^\{"price":\{"id":"\d+","spec":"\w+","value":\d+,"currency":"[^"]*"\},"error":\{\},"id":\d+\}$/m
  end

  # Issue 28: a large bulk body is cut into pieces searched on every
  # scheduler. The answer must not show the cut: every line in request
  # order, errors where they stood, across the pieces' boundaries; and the
  # pieces must run in more processes than there are schedulers when more
  # than one is online (one process, as before, leaves a core idle; one
  # per scheduler leaves it idle while a piece's search runs on a dirty
  # scheduler).
  test "bulk: a large body is answered in order, its pieces searched in several processes", %{
    port: port,
    requests: requests
  } do
    [{first, _} | _] = requests
    first = :jiffy.decode(first, [:return_maps])
    count = 2_500
    # Unknown offerings, one every 97 lines: some fall on the pieces' edges.
    bad? = fn id -> rem(id, 97) == 0 end

    {lines, expected} =
      for id <- 0..(count - 1) do
        if bad?.(id) do
          {encode(Map.merge(first, %{"id" => id, "offeringId" => "no-such-offering"})), {id, nil}}
        else
          {body, price} = Enum.at(requests, rem(id, length(requests)))
          {encode(Map.put(:jiffy.decode(body, [:return_maps]), "id", id)), {id, price}}
        end
      end
      |> Enum.unzip()

    body = Enum.join(lines, "\n") <> "\n"

    # Which processes call Larder.Table.search_many/2 while the body is answered.
    :erlang.trace_pattern({Larder.Table, :search_many, 2}, true, [:local])
    :erlang.trace(:all, true, [:call])

    answer =
      try do
        assert {200, _headers, answer} = C.post(port, @bulk, body, 'application/x-ndjson')
        answer
      after
        :erlang.trace(:all, false, [:call])
        :erlang.trace_pattern({Larder.Table, :search_many, 2}, false, [:local])
      end

    callers = collect_callers(MapSet.new())

    answered =
      answer |> String.split("\n", trim: true) |> Enum.map(&:jiffy.decode(&1, [:return_maps]))

    assert length(answered) == count

    for {line, {id, price}} <- Enum.zip(answered, expected) do
      assert line["id"] == id

      if price do
        assert %{"price" => %{"id" => pid, "value" => value}} = line
        assert {pid, value} == {Integer.to_string(price.idx), price.value}
      else
        assert line["error"]["message"] == "unable find offeringId in index"
      end
    end

    # Several pieces a scheduler, so that one waiting on a dirty scheduler
    # leaves its own to another.
    if System.schedulers_online() > 1,
      do: assert(MapSet.size(callers) > System.schedulers_online())
  end

  # A cut after a newline may fall inside a value that spans lines, or after
  # a stray bracket that ends the stream: the body is then read as a whole,
  # as Go reads it.
  test "bulk: a large body cut inside a value, or ended by a stray bracket, is read as Go reads it",
       %{port: port, requests: requests} do
    values =
      for id <- 0..599 do
        {body, price} = Enum.at(requests, rem(id, length(requests)))
        json = Map.put(:jiffy.decode(body, [:return_maps]), "id", id)
        {:jiffy.encode(json, [:pretty]), price}
      end

    assert Enum.all?(values, fn {json, _} -> json =~ "\n" end)
    body = Enum.map_join(values, "\n", &elem(&1, 0)) <> "\n"
    assert byte_size(body) > 64 * 1024

    assert {200, _, answer} = C.post(port, @bulk, body, 'application/x-ndjson')

    lines =
      answer |> String.split("\n", trim: true) |> Enum.map(&:jiffy.decode(&1, [:return_maps]))

    assert Enum.map(lines, & &1["id"]) == Enum.to_list(0..599)

    for {line, {_json, price}} <- Enum.zip(lines, values),
        do: assert(line["price"]["id"] == Integer.to_string(price.idx))

    # A stray "]" after the 100th value ends the stream there.
    {first, rest} = Enum.split(Enum.map(values, &elem(&1, 0)), 100)
    body = Enum.join(first ++ ["]"] ++ rest, "\n") <> "\n"
    assert {200, _, answer} = C.post(port, @bulk, body, 'application/x-ndjson')

    lines =
      answer |> String.split("\n", trim: true) |> Enum.map(&:jiffy.decode(&1, [:return_maps]))

    assert Enum.map(lines, & &1["id"]) == Enum.to_list(0..99)
  end

  defp collect_callers(acc) do
    receive do
      {:trace, pid, :call, {Larder.Table, :search_many, _}} ->
        collect_callers(MapSet.put(acc, pid))
    after
      100 -> acc
    end
  end

  # One request on a plain socket; the whole raw response, read until close.
  defp raw_post(port, path, body) do
    {:ok, socket} = :gen_tcp.connect({127, 0, 0, 1}, port, [:binary, active: false])

    :ok =
      :gen_tcp.send(socket, [
        "POST #{path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n",
        "Content-Length: #{byte_size(body)}\r\n\r\n",
        body
      ])

    read_all(socket, [])
  end

  defp read_all(socket, acc) do
    case :gen_tcp.recv(socket, 0, 10_000) do
      {:ok, data} -> read_all(socket, [acc | data])
      {:error, :closed} -> IO.iodata_to_binary(acc)
    end
  end

  test "bulk: a value that cannot be read stops the body, as in Go", %{
    port: port,
    requests: [{body, price} | _]
  } do
    line = fn id -> encode(Map.put(:jiffy.decode(body, [:return_maps]), "id", id)) end
    answered = ~s({"price":#{String.trim_trailing(price_body(price))},"error":{},"id":1}\n)

    # The lines before it are answered, then "Unable decode body".
    for bad <- ["{\"id\":2,\n", line.(65_536), line.(-1), line.("7"), "[1,2]", "x"] do
      assert {200, _, answer} =
               C.post(
                 port,
                 @bulk,
                 line.(1) <> "\n" <> bad <> "\n" <> line.(3),
                 'application/x-ndjson'
               )

      assert answer == answered <> "Unable decode body\n"
    end

    # None before it: a 400.
    assert {400, headers, "Unable decode body\n"} = C.post(port, @bulk, "[" <> line.(1) <> "]")
    assert headers["content-type"] == "text/plain; charset=utf-8"

    # A line without an id is id 0.
    assert {200, _, answer} = C.post(port, @bulk, ~s({"offeringId":"x"}))
    assert answer == ~s({"error":{"message":"unable find offeringId in index"},"id":0}\n)

    # An empty body answers 200 with no lines.
    assert {200, _, ""} = C.post(port, @bulk, "", 'application/x-ndjson')
  end

  test "every error status", %{port: port, requests: [{body, _} | _]} do
    request = :jiffy.decode(body, [:return_maps])

    # 400, Go's messages: malformed JSON says where; a wrong type names the field.
    assert {400, headers, message} = C.post(port, @bitmap, ~s({"offeringId": "a",,}))
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert message == "Request body contains badly-formed JSON (at position 20)\n"
    assert {400, _, "Request body must not be empty\n"} = C.post(port, @bitmap, "")
    assert {400, _, "Request body contains badly-formed JSON\n"} = C.post(port, @bitmap, "{")

    for {field, value} <- [
          {"offeringId", 1},
          {"groupId", [1]},
          {"priceSpecId", %{}},
          {"charValues", "Term"}
        ] do
      assert {400, _, message} = C.post(port, @bitmap, encode(Map.put(request, field, value)))

      assert message =~
               ~r/^Request body contains an invalid Value for the "#{field}" field \(at position \d+\)\n$/
    end

    assert {400, _, message} =
             C.post(
               port,
               @bitmap,
               encode(Map.put(request, "charValues", [%{"char" => "a", "value" => "b"}, 3]))
             )

    assert message =~ ~s(the "charValues" field)

    assert {400, _,
            ~s(Request body contains an invalid Value for the "" field \(at position 1\)\n)} =
             C.post(port, @bitmap, "[1]")

    # 404: no price (plain text, Go's messages), and an unknown path.
    assert {404, _, "unable find price\n"} =
             C.post(port, @map, encode(Map.delete(request, "groupId")))

    no_price = Map.put(request, "charValues", [%{"char" => "Term", "value" => "999"}])

    assert {404, headers, "unable to find charValue in index\n"} =
             C.post(port, @bitmap, encode(no_price))

    assert headers["content-type"] =~ "text/plain"

    assert {404, _, "unable find groupId in index\n"} =
             C.post(port, @bitmap, encode(Map.put(request, "groupId", "group9")))

    assert {404, _, "unable find price\n"} =
             C.post(port, @map, encode(Map.put(request, "priceSpecId", "XRC")))

    assert {404, _, "404 page not found\n"} = C.get(port, '/v1/search/nothing')
    assert {404, _, _} = C.post(port, '/v2/search/bitmap/prices', body)

    # 405: a known path, another method.
    assert {405, %{"allow" => "POST"}, _} = C.get(port, @bitmap)

    assert {405, %{"allow" => "POST"}, _} =
             C.request(:put, {C.url(port, @bulk), [], 'application/json', body})

    assert {405, %{"allow" => "GET"}, _} = C.post(port, '/health', "")

    # 413: a body over the limit (1 MB), refused from its Content-Length.
    big = String.duplicate(" ", 1024 * 1024) <> body
    assert {413, _, "Request body must not be larger than 1MB\n"} = C.post(port, @bitmap, big)
    assert {413, _, _} = C.post(port, @map, big)

    # 413: a bulk body of more than 65,536 requests.
    many = String.duplicate(~s({"id":1}\n), 65_537)
    assert {413, _, _} = C.post(port, @bulk, many, 'application/x-ndjson')

    # 503: a listener whose catalogue is not loaded.
    {:ok, listener} = PriceSearch.HTTP.start_link(port: 0, ip: {127, 0, 0, 1}, store: :not_loaded)
    other = PriceSearch.HTTP.port(listener)
    assert {503, _, _} = C.get(other, '/health')
    assert {503, _, _} = C.post(other, @bitmap, body)
    assert {503, _, _} = C.post(other, @bulk, body)
    :ok = PriceSearch.HTTP.stop(listener)

    # Still serving.
    assert {200, _, _} = C.post(port, @bitmap, body)
  end

  test "50 concurrent clients each get the right answers", %{port: port, requests: requests} do
    requests = List.to_tuple(requests)

    results =
      1..50
      |> Task.async_stream(
        fn client ->
          for i <- 0..19 do
            {body, price} = elem(requests, rem(client * 7 + i, tuple_size(requests)))
            {status, _, answer} = C.post(port, @bitmap, body)
            {status, answer} == {200, price_body(price)}
          end
        end,
        max_concurrency: 50,
        timeout: 120_000
      )
      |> Enum.flat_map(fn {:ok, oks} -> oks end)

    assert length(results) == 1000
    assert Enum.all?(results)
  end
end
