from engine.decoding.stop_strings import StopStringBuffer


def feed(stops, pieces):
    buf = StopStringBuffer(tuple(stops))
    out = []
    for piece in pieces:
        out.append(buf.push(piece))
        if buf.stopped:
            return "".join(out), True
    return "".join(out) + buf.flush(), False


def test_text_without_stops_passes_straight_through():
    buf = StopStringBuffer(())
    assert buf.push("hello") == "hello"


def test_a_stop_split_across_tokens_is_caught_and_not_returned():
    assert feed(["END"], ["abc E", "N", "D and more"]) == ("abc ", True)


def test_text_that_only_looked_like_a_stop_is_released():
    buf = StopStringBuffer(("END",))
    assert buf.push("abc EN") == "abc "
    assert buf.push("x") == "ENx"
    assert not buf.stopped


def test_held_back_text_is_released_at_the_end():
    assert feed(["END"], ["abc E"]) == ("abc E", False)


def test_the_earliest_of_several_stops_wins():
    assert feed(["world", "lo"], ["hello world"]) == ("hel", True)


def test_empty_stop_strings_are_ignored():
    assert feed([""], ["abc"]) == ("abc", False)
