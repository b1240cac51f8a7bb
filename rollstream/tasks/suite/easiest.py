"""Suite definitions: the easiest tasks (difficulty 0), one-liners with a familiar name.

Added after measuring SmolLM2-135M-Instruct (docs/tasks.md): the families where it solved
nothing need tasks it sometimes solves, or GRPO gets no signal from them.
"""

from rollstream.tasks.suite.authoring import T

DEFS = [
    # strings
    T("strings", "concat(a: str, b: str) -> str", "returns the two strings a and b joined together",
      "return a + b", "return b + a", ["'foo', 'bar'", "'', 'x'", "'a', 'b'"], ["'hello ', 'world'", "'', ''"], 0),
    T("strings", "to_lower(s: str) -> str", "returns s with every letter converted to lower case",
      "return s.lower()", "return s.upper()", ["'Hello'", "'ABC'", "''"], ["'MiXeD 1'", "'x'"], 0),
    T("strings", "starts_with(s: str, prefix: str) -> bool", "returns True if the string s starts with prefix",
      "return s.startswith(prefix)", "return s.endswith(prefix)", ["'hello', 'he'", "'hello', 'lo'", "'abc', ''"], ["'', 'a'", "'aa', 'aa'"], 0),
    T("strings", "exclaim(s: str) -> str", "returns s with an exclamation mark '!' added at the end",
      "return s + '!'", "return '!' + s", ["'hi'", "''", "'wow'"], ["'a b'", "'!'"], 0),
    # sets
    T("sets", "to_set(items: list) -> set", "returns the set of the elements of items",
      "return set(items)", "return list(items)", ["[1, 2, 2]", "[]", "['a']"], ["[3, 3, 3]", "[1, 2]"], 0),
    T("sets", "in_set(s: set, x: object) -> bool", "returns True if x is an element of the set s",
      "return x in s", "return x not in s", ["{1, 2}, 1", "{1, 2}, 3", "set(), 0"], ["{'a'}, 'a'", "{0}, 1"], 0),
    T("sets", "add_to_set(s: set, x: object) -> set", "returns a new set with the elements of s and x",
      "return s | {x}", "return s", ["{1, 2}, 3", "set(), 'a'", "{1}, 1"], ["{5}, 6", "{'x'}, 'y'"], 0),
    T("sets", "set_union(a: set, b: set) -> set", "returns the union of the sets a and b",
      "return a | b", "return a & b", ["{1, 2}, {2, 3}", "set(), {1}", "{1}, set()"], ["{4}, {4}", "{1, 2}, {3, 4}"], 0),
    # time_arith
    T("time_arith", "minutes_to_seconds(m: int) -> int", "returns the number of seconds in m minutes",
      "return m * 60", "return m * 100", ["1", "0", "5"], ["60", "2"], 0),
    T("time_arith", "days_to_hours(d: int) -> int", "returns the number of hours in d days",
      "return d * 24", "return d * 12", ["1", "0", "7"], ["2", "30"], 0),
    T("time_arith", "hours_to_minutes(h: int) -> int", "returns the number of minutes in h hours",
      "return h * 60", "return h * 100", ["1", "0", "3"], ["24", "10"], 0),
    T("time_arith", "weeks_to_days(w: int) -> int", "returns the number of days in w weeks",
      "return w * 7", "return w * 5", ["1", "0", "4"], ["52", "2"], 0),
    # search_sort
    T("search_sort", "find_max(nums: list[int]) -> int", "returns the largest number in the non-empty list nums",
      "return max(nums)", "return min(nums)", ["[1, 5, 3]", "[7]", "[-2, -9]"], ["[4, 4, 2]", "[0, 10]"], 0),
    T("search_sort", "find_min(nums: list[int]) -> int", "returns the smallest number in the non-empty list nums",
      "return min(nums)", "return max(nums)", ["[1, 5, 3]", "[7]", "[-2, -9]"], ["[4, 4, 2]", "[0, 10]"], 0),
    T("search_sort", "sort_list(nums: list[int]) -> list[int]", "returns a new list with the numbers of nums in increasing order",
      "return sorted(nums)", "return nums", ["[3, 1, 2]", "[]", "[2, 2, 1]"], ["[9, -1]", "[5]"], 0),
    T("search_sort", "find_index(items: list, x: object) -> int", "returns the index of the first occurrence of x in items (x is always present)",
      "return items.index(x)", "return items.index(x) + 1", ["[5, 6, 7], 6", "['a'], 'a'", "[1, 2, 1], 1"], ["[0, 0, 3], 3", "[9, 8], 8"], 0),
    # dicts
    T("dicts", "get_keys(d: dict) -> list", "returns the list of the keys of d, in insertion order",
      "return list(d.keys())", "return list(d.values())", ["{'a': 1, 'b': 2}", "{}", "{1: 'x'}"], ["{'z': 0}", "{'p': 1, 'q': 2, 'r': 3}"], 0),
    T("dicts", "get_values(d: dict) -> list", "returns the list of the values of d, in insertion order",
      "return list(d.values())", "return list(d.keys())", ["{'a': 1, 'b': 2}", "{}", "{1: 'x'}"], ["{'z': 0}", "{'p': 1, 'q': 2, 'r': 3}"], 0),
    T("dicts", "make_dict(key: str, value: int) -> dict", "returns a dictionary with the single item key: value",
      "return {key: value}", "return {value: key}", ["'a', 1", "'x', 0", "'key', 42"], ["'', 5", "'b', -1"], 0),
    T("dicts", "lookup(d: dict, key: object) -> object", "returns the value stored under key in d (the key is always present)",
      "return d[key]", "return key", ["{'a': 1}, 'a'", "{'x': 'y', 'z': 'w'}, 'z'", "{1: 2}, 1"], ["{'k': None}, 'k'", "{0: 'zero'}, 0"], 0),
    # parsing
    T("parsing", "to_int(s: str) -> int", "converts the string s, which holds a whole number, to an int",
      "return int(s)", "return len(s)", ["'42'", "'-7'", "'0'"], ["'1000'", "'12'"], 0),
    T("parsing", "to_str(n: int) -> str", "converts the integer n to a string",
      "return str(n)", "return n", ["42", "-7", "0"], ["1000", "5"], 0),
    T("parsing", "split_words(s: str) -> list[str]", "returns the list of whitespace-separated words of s",
      "return s.split()", "return list(s)", ["'hello world'", "''", "'a  b c'"], ["'one'", "' x y '"], 0),
    T("parsing", "split_commas(s: str) -> list[str]", "splits s at every comma and returns the parts",
      "return s.split(',')", "return s.split()", ["'a,b,c'", "'one'", "'x,,y'"], ["','", "'1,2'"], 0),
    # matrices
    T("matrices", "first_row(m: list[list[int]]) -> list[int]", "returns the first row of the non-empty matrix m",
      "return m[0]", "return m[-1]", ["[[1, 2], [3, 4]]", "[[5]]", "[[1, 2, 3], [4, 5, 6]]"], ["[[0], [1], [2]]", "[[7, 8]]"], 0),
    T("matrices", "num_rows(m: list[list[int]]) -> int", "returns the number of rows of the matrix m",
      "return len(m)", "return len(m[0]) if m else 0", ["[[1, 2, 3], [4, 5, 6]]", "[]", "[[1], [2], [3]]"], ["[[5]]", "[[1, 2]]"], 0),
    T("matrices", "num_cols(m: list[list[int]]) -> int", "returns the number of columns of the non-empty matrix m",
      "return len(m[0])", "return len(m)", ["[[1, 2, 3], [4, 5, 6]]", "[[1], [2], [3]]", "[[5]]"], ["[[1, 2]]", "[[0, 0], [0, 0]]"], 0),
    T("matrices", "get_element(m: list[list[int]], r: int, c: int) -> int", "returns the element in row r and column c of the matrix m",
      "return m[r][c]", "return m[c][r]", ["[[1, 2], [3, 4]], 0, 1", "[[5]], 0, 0", "[[1, 2, 3], [4, 5, 6]], 1, 0"], ["[[7, 8], [9, 10]], 1, 1", "[[0, 1]], 0, 1"], 0),
]
