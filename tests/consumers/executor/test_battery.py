"""An honest battery: tasks written the way four published datasets write them, each with its
correct reference (the honest code itself), through the real Docker sandbox.

Every task must score 1.0 under the judge (``trust = "judge"``, its reference check judged) and
1.0 in process (the control: the task itself is correct). The styles:

1. **MBPP**: a function (the row's ``code``, CRLF line endings and tabs included where the rows
   have them) and a list of plain ``assert f(...) == ...`` lines; some tests read ``math`` (or
   ``set``) without importing it, relying on the solution's import; the entry point is taken from
   the first test, as ``rollstream.tasks.sources`` does for MBPP rows.
2. **HumanEval**: ``setup`` is the prompt (signature + docstring stub, and the prompt's helpers),
   the completion restates it with a body (or rewrites it whole, as models do), and the test is
   the dataset's ``def check(candidate): ...`` followed by ``check(entry_point)``.
3. **LeetCode**: ``class Solution`` (and design classes); ``setup`` is a harness prelude with
   ``ListNode``/``TreeNode`` and their builders (LeetCodeDataset's star-import prelude, or a plain
   one); tests call ``Solution().method`` directly or through ``check(candidate)``.
4. **BigCodeBench**: ``def task_func(...)`` on the standard library, tested by
   ``unittest.TestCase`` classes (``setUp``/``tearDown``, ``mock.patch`` as decorator and context
   manager, ``assertRaises``, ``assertAlmostEqual``, ``subTest``), run by ``unittest.main`` or a
   runner whose result the test asserts.

A task the judge scores below full while the control passes is a judge bug (``JudgeWrong``). The
first run of this battery found eight, all fixed: the setup's star-imported classes taken for
setup classes (``typing.Any``), ``os.fdopen`` of a ``mkstemp`` descriptor refused, mocks recording
the judge's own ``==``/``hash``, the completion's threads calling the tests' objects at once,
``os.environ`` and ``os.chdir`` of the tests not reaching the completion, log records not reaching
``assertLogs``, and ``pathlib``/``uuid`` values crossing as handles.
"""

from __future__ import annotations

import re
import textwrap
import uuid

import pytest

from rollstream.consumers.executor.reference import ReferenceChecks
from rollstream.consumers.executor.score import Evaluation, evaluate
from rollstream.schemas.events import RewardSpec

pytestmark = pytest.mark.sandbox

STYLES = ("mbpp", "humaneval", "leetcode", "bigcodebench")


class JudgeWrong(AssertionError):
    """The judge scored an honest task below full (while the in-process control scored it full)."""


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def task(style, name, code, tests, *, setup="", entry=""):
    assert style in STYLES
    assert code.endswith("\n")
    return pytest.param(style, code, tests, setup, entry, id=f"{style}-{name}")


# ================================================================ 1. MBPP

def mbpp(name, code, tests, *, crlf=False):
    """An MBPP row: ``code`` and ``test_list``; the entry point exactly as the MBPP loader finds it
    (``rollstream.tasks.sources._mbpp_task``: ``set`` or ``abs`` when the first test starts so, none
    for ``math.isclose``)."""
    match = re.search(r"assert\s+(?:not\s+)?\(?\s*(\w+)\s*\(", tests[0])
    entry = match.group(1) if match else ""
    if crlf:
        code = code.replace("\n", "\r\n")
    return task("mbpp", name, code, tests, entry=entry)


MBPP = [
    mbpp("remove_Occ",
         "def remove_Occ(s,ch): \n    for i in range(len(s)): \n        if (s[i] == ch): \n"
         "            s = s[0 : i] + s[i + 1:] \n            break\n    for i in range(len(s) - 1,-1,-1):  \n"
         "        if (s[i] == ch): \n            s = s[0 : i] + s[i + 1:] \n            break\n    return s \n",
         ['assert remove_Occ("hello","l") == "heo"', 'assert remove_Occ("abcda","a") == "bcd"',
          'assert remove_Occ("PHP","P") == "H"'], crlf=True),
    mbpp("sort_matrix", "def sort_matrix(M):\n    result = sorted(M, key=sum)\n    return result\n",
         ["assert sort_matrix([[1, 2, 3], [2, 4, 5], [1, 1, 1]])==[[1, 1, 1], [1, 2, 3], [2, 4, 5]]",
          "assert sort_matrix([[1, 2, 3], [-2, 4, -5], [1, -1, 1]])==[[-2, 4, -5], [1, -1, 1], [1, 2, 3]]",
          "assert sort_matrix([[5,8,9],[6,4,3],[2,1,4]])==[[2, 1, 4], [6, 4, 3], [5, 8, 9]]"], crlf=True),
    mbpp("count_common",
         "from collections import Counter\ndef count_common(words):\n  word_counts = Counter(words)\n"
         "  top_four = word_counts.most_common(4)\n  return (top_four)\n",
         ["assert count_common(['red','green','black','pink','black','white','black','eyes','white','black','orange',"
          "'pink','pink','red','red','white','orange','white',\"black\",'pink','green','green','pink','green','pink',"
          "'white','orange',\"orange\",'red']) == [('pink', 6), ('black', 5), ('white', 5), ('red', 4)]",
          "assert count_common(['one', 'two', 'three', 'four', 'five', 'one', 'two', 'one', 'three', 'one']) == "
          "[('one', 4), ('two', 2), ('three', 2), ('four', 1)]",
          "assert count_common(['Facebook', 'Apple', 'Amazon', 'Netflix', 'Google', 'Apple', 'Netflix', 'Amazon']) == "
          "[('Apple', 2), ('Amazon', 2), ('Netflix', 2), ('Facebook', 1)]"]),
    mbpp("find_Volume", "def find_Volume(l,b,h) : \n    return ((l * b * h) / 2) \n",
         ["assert find_Volume(10,8,6) == 240", "assert find_Volume(3,2,2) == 6", "assert find_Volume(1,2,1) == 1"],
         crlf=True),
    mbpp("split_lowerstring", "import re\ndef split_lowerstring(text):\n return (re.findall('[a-z][^a-z]*', text))\n",
         ["assert split_lowerstring(\"AbCd\")==['bC','d']",
          "assert split_lowerstring(\"Python\")==['y', 't', 'h', 'o', 'n']",
          "assert split_lowerstring(\"Programming\")==['r', 'o', 'g', 'r', 'a', 'm', 'm', 'i', 'n', 'g']"], crlf=True),
    mbpp("text_lowercase_underscore",
         "import re\ndef text_lowercase_underscore(text):\n        patterns = '^[a-z]+_[a-z]+$'\n"
         "        if re.search(patterns,  text):\n                return 'Found a match!'\n        else:\n"
         "                return('Not matched!')\n",
         ['assert text_lowercase_underscore("aab_cbbbc")==(\'Found a match!\')',
          'assert text_lowercase_underscore("aab_Abbbc")==(\'Not matched!\')',
          'assert text_lowercase_underscore("Aaab_abbbc")==(\'Not matched!\')']),
    mbpp("test_duplicate",
         "def test_duplicate(arraynums):\n    nums_set = set(arraynums)    \n    return len(arraynums) != len(nums_set)     \n",
         ["assert test_duplicate(([1,2,3,4,5]))==False", "assert test_duplicate(([1,2,3,4, 4]))==True",
          "assert test_duplicate([1,1,2,2,3,3,4,4,5])==True"], crlf=True),
    mbpp("is_woodall",
         "def is_woodall(x): \n\tif (x % 2 == 0): \n\t\treturn False\n\tif (x == 1): \n\t\treturn True\n\tx = x + 1 \n"
         "\tp = 0\n\twhile (x % 2 == 0): \n\t\tx = x/2\n\t\tp = p + 1\n\t\tif (p == x): \n\t\t\treturn True\n\treturn False\n",
         ["assert is_woodall(383) == True", "assert is_woodall(254) == False", "assert is_woodall(200) == False"]),
    mbpp("heap_queue_largest",
         "import heapq as hq\ndef heap_queue_largest(nums,n):\n  largest_nums = hq.nlargest(n, nums)\n  return largest_nums\n",
         ["assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],3)==[85, 75, 65] ",
          "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],2)==[85, 75]",
          "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],5)==[85, 75, 65, 58, 35]"]),
    mbpp("common_in_nested_lists-set",
         "def common_in_nested_lists(nestedlist):\n    result = list(set.intersection(*map(set, nestedlist)))\n    return result\n",
         ["assert set(common_in_nested_lists([[12, 18, 23, 25, 45], [7, 12, 18, 24, 28], [1, 5, 8, 12, 15, 16, 18]]))==set([18, 12])",
          "assert set(common_in_nested_lists([[12, 5, 23, 25, 45], [7, 11, 5, 23, 28], [1, 5, 8, 18, 23, 16]]))==set([5,23])",
          "assert set(common_in_nested_lists([[2, 3,4, 1], [4, 5], [6,4, 8],[4, 5], [6, 8,4]]))==set([4])"], crlf=True),
    mbpp("volume_cylinder-math-isclose",
         "import math\ndef volume_cylinder(r,h):\n  volume=math.pi*r*r*h\n  return volume\n",
         ["assert math.isclose(volume_cylinder(10,5), 1570.7500000000002, rel_tol=0.001)",
          "assert math.isclose(volume_cylinder(4,5), 251.32000000000002, rel_tol=0.001)",
          "assert math.isclose(volume_cylinder(4,10), 502.64000000000004, rel_tol=0.001)"]),
    mbpp("radian_degree",
         "import math\ndef radian_degree(degree):\n radian = degree*(math.pi/180)\n return radian\n",
         ["assert radian_degree(90)==1.5707963267948966", "assert radian_degree(60)==1.0471975511965976",
          "assert radian_degree(120)==2.0943951023931953", "assert math.isclose(radian_degree(45), math.pi / 4)"],
         crlf=True),
    mbpp("area_tetrahedron-abs-tol",
         "import math\ndef area_tetrahedron(side):\n  area = math.sqrt(3)*(side*side)\n  return area\n",
         ["assert abs(area_tetrahedron(3) - 15.588457268119894) < 1e-9",
          "assert abs(area_tetrahedron(20) - 692.8203230275509) < 1e-9",
          "assert math.isclose(area_tetrahedron(10), 173.20508075688772, rel_tol=0.001)"]),
    mbpp("zero_count-float",
         "from array import array\ndef zero_count(nums):\n    n = len(nums)\n    n1 = 0\n    for x in nums:\n"
         "        if x == 0:\n            n1 += 1\n        else:\n          None\n    return round(n1/(n-n1),2)\n",
         ["assert abs(zero_count([0, 1, 2, -1, -5, 6, 0, -3, -2, 3, 4, 6, 8]) - 0.18) < 0.001",
          "assert abs(zero_count([2, 1, 2, -1, -5, 6, 4, -3, -2, 3, 4, 6, 8]) - 0.00) < 0.001",
          "assert abs(zero_count([2, 4, -6, -9, 11, -12, 14, -5, 17]) - 0.00) < 0.001"]),
    mbpp("find_dissimilar-tuples-of-sets",
         "def find_dissimilar(test_tup1, test_tup2):\n  res = tuple(set(test_tup1) ^ set(test_tup2))\n  return (res) \n",
         ["assert find_dissimilar((3, 4, 5, 6), (5, 7, 4, 10)) == (3, 6, 7, 10)",
          "assert find_dissimilar((1, 2, 3, 4), (7, 2, 3, 9)) == (1, 4, 7, 9)",
          "assert find_dissimilar((21, 11, 25, 26), (26, 34, 21, 36)) == (34, 36, 11, 25)"], crlf=True),
    mbpp("freq_count-dict",
         "import collections\ndef freq_count(list1):\n  freq_count= collections.Counter(list1)\n  return freq_count\n",
         ["assert freq_count([10,10,10,10,20,20,20,20,40,40,50,50,30])==({10: 4, 20: 4, 40: 2, 50: 2, 30: 1}) ",
          "assert freq_count([1,2,3,4,3,2,4,1,3,1,4])==({1:3, 2:2,3:3,4:3}) ",
          "assert freq_count([5,6,7,4,9,10,4,5,6,7,9,5])==({10:1,5:3,6:2,7:2,4:2,9:2}) "], crlf=True),
    mbpp("second_smallest-none",
         "def second_smallest(numbers):\n  unique_numbers = list(set(numbers))\n  unique_numbers.sort()\n"
         "  if len(unique_numbers) < 2:\n    return None\n  else:\n    return unique_numbers[1]\n",
         ["assert second_smallest([1, 2, -8, -2, 0, -2])==-2", "assert second_smallest([1, 1, -0.5, 0, 2, -2, -2])==-0.5",
          "assert second_smallest([2,2])==None", "assert second_smallest([2,2,2])==None"]),
    mbpp("check_none-bool",
         "def check_none(test_tup):\n  res = any(map(lambda ele: ele is None, test_tup))\n  return res \n",
         ["assert check_none((10, 4, 5, 6, None)) == True", "assert check_none((7, 8, 9, 11, 14)) == False",
          "assert check_none((1, 2, 3, 4, None)) == True"], crlf=True),
    mbpp("add_tuple-list-plus-tuple",
         "def add_tuple(test_list, test_tup):\n  test_list += test_tup\n  return test_list\n",
         ["assert add_tuple([5, 6, 7], (9, 10)) == [5, 6, 7, 9, 10]",
          "assert add_tuple([6, 7, 8], (10, 11)) == [6, 7, 8, 10, 11]",
          "assert add_tuple([7, 8, 9], (11, 12)) == [7, 8, 9, 11, 12]"]),
    mbpp("flatten_list-nested",
         "def flatten_list(list1):\n    result_list = []\n    if not list1: return result_list\n    stack = [list(list1)]\n"
         "    while stack:\n        c_num = stack.pop()\n        next = c_num.pop()\n        if c_num: stack.append(c_num)\n"
         "        if isinstance(next, list):\n            if next: stack.append(list(next))\n"
         "        else: result_list.append(next)\n    result_list.reverse()\n    return result_list \n",
         ["assert flatten_list([0, 10, [20, 30], 40, 50, [60, 70, 80], [90, 100, 110, 120]])==[0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120]",
          "assert flatten_list([[10, 20], [40], [30, 56, 25], [10, 20], [33], [40]])==[10, 20, 40, 30, 56, 25, 10, 20, 33, 40]",
          "assert flatten_list([[1,2,3], [4,5,6], [10,11,12], [7,8,9]])==[1, 2, 3, 4, 5, 6, 10, 11, 12, 7, 8, 9]"]),
    mbpp("subject_marks-sort-lambda",
         "def subject_marks(subjectmarks):\n#subject_marks = [('English', 88), ('Science', 90), ('Maths', 97), ('Social sciences', 82)])\n"
         " subjectmarks.sort(key = lambda x: x[1])\n return subjectmarks\n",
         ["assert subject_marks([('English', 88), ('Science', 90), ('Maths', 97), ('Social sciences', 82)])==[('Social sciences', 82), ('English', 88), ('Science', 90), ('Maths', 97)]",
          "assert subject_marks([('Telugu',49),('Hindhi',54),('Social',33)])==([('Social',33),('Telugu',49),('Hindhi',54)])",
          "assert subject_marks([('Physics',96),('Chemistry',97),('Biology',45)])==([('Biology',45),('Physics',96),('Chemistry',97)])"],
         crlf=True),
    mbpp("max_aggregate-defaultdict",
         "from collections import defaultdict\ndef max_aggregate(stdata):\n    temp = defaultdict(int)\n"
         "    for name, marks in stdata:\n        temp[name] += marks\n    return max(temp.items(), key=lambda x: x[1])\n",
         ["assert max_aggregate([('Juan Whelan',90),('Sabah Colley',88),('Peter Nichols',7),('Juan Whelan',122),('Sabah Colley',84)])==('Juan Whelan', 212)",
          "assert max_aggregate([('Juan Whelan',50),('Sabah Colley',48),('Peter Nichols',37),('Juan Whelan',22),('Sabah Colley',14)])==('Juan Whelan', 72)",
          "assert max_aggregate([('Juan Whelan',10),('Sabah Colley',20),('Peter Nichols',30),('Juan Whelan',40),('Sabah Colley',50)])==('Sabah Colley', 70)"]),
    mbpp("combinations_colors-itertools",
         "from itertools import combinations_with_replacement \ndef combinations_colors(l, n):\n"
         "    return list(combinations_with_replacement(l,n))\n",
         ["assert combinations_colors( [\"Red\",\"Green\",\"Blue\"],1)==[('Red',), ('Green',), ('Blue',)]",
          "assert combinations_colors( [\"Red\",\"Green\",\"Blue\"],2)==[('Red', 'Red'), ('Red', 'Green'), ('Red', 'Blue'), ('Green', 'Green'), ('Green', 'Blue'), ('Blue', 'Blue')]",
          "assert combinations_colors( [\"Red\",\"Green\",\"Blue\"],3)==[('Red', 'Red', 'Red'), ('Red', 'Red', 'Green'), ('Red', 'Red', 'Blue'), ('Red', 'Green', 'Green'), ('Red', 'Green', 'Blue'), ('Red', 'Blue', 'Blue'), ('Green', 'Green', 'Green'), ('Green', 'Green', 'Blue'), ('Green', 'Blue', 'Blue'), ('Blue', 'Blue', 'Blue')]"],
         crlf=True),
    mbpp("remove_whitespaces-re-sub",
         "import re\ndef remove_whitespaces(text1):\n  return (re.sub(r'\\s+', '',text1))\n",
         ["assert remove_whitespaces(' Google    Flutter ') == 'GoogleFlutter'",
          "assert remove_whitespaces(' Google    Dart ') == 'GoogleDart'",
          "assert remove_whitespaces(' iOS    Swift ') == 'iOSSwift'"]),
    mbpp("sort_counter-most_common",
         "from collections import Counter\ndef sort_counter(dict1):\n x = Counter(dict1)\n sort_counter=x.most_common()\n return sort_counter\n",
         ["assert sort_counter({'Math':81, 'Physics':83, 'Chemistry':87})==[('Chemistry', 87), ('Physics', 83), ('Math', 81)]",
          "assert sort_counter({'Math':400, 'Physics':300, 'Chemistry':250})==[('Math', 400), ('Physics', 300), ('Chemistry', 250)]",
          "assert sort_counter({'Math':900, 'Physics':1000, 'Chemistry':1250})==[('Chemistry', 1250), ('Physics', 1000), ('Math', 900)]"],
         crlf=True),
    mbpp("max_chain_length-class-Pair",
         "class Pair(object): \n\tdef __init__(self, a, b): \n\t\tself.a = a \n\t\tself.b = b \ndef max_chain_length(arr, n): \n"
         "\tmax = 0\n\tmcl = [1 for i in range(n)] \n\tfor i in range(1, n): \n\t\tfor j in range(0, i): \n"
         "\t\t\tif (arr[i].a > arr[j].b and\n\t\t\t\tmcl[i] < mcl[j] + 1): \n\t\t\t\tmcl[i] = mcl[j] + 1\n"
         "\tfor i in range(n): \n\t\tif (max < mcl[i]): \n\t\t\tmax = mcl[i] \n\treturn max\n",
         ["assert max_chain_length([Pair(5, 24), Pair(15, 25),Pair(27, 40), Pair(50, 60)], 4) == 3",
          "assert max_chain_length([Pair(1, 2), Pair(3, 4),Pair(5, 6), Pair(7, 8)], 4) == 4",
          "assert max_chain_length([Pair(19, 10), Pair(11, 12),Pair(13, 14), Pair(15, 16), Pair(31, 54)], 5) == 5"],
         crlf=True),
    mbpp("convert-cmath-polar",
         "import cmath  \ndef convert(numbers):    \n  num = cmath.polar(numbers)  \n  return (num) \n",
         ["assert convert(1) == (1.0, 0.0)", "assert convert(4) == (4.0,0.0)", "assert convert(5) == (5.0,0.0)",
          "assert all(abs(a - b) < 1e-9 for a, b in zip(convert(1j), (1.0, 1.5707963267948966)))"], crlf=True),
    mbpp("left_insertion-bisect",
         "import bisect\ndef left_insertion(a, x):\n    i = bisect.bisect_left(a, x)\n    return i\n",
         ["assert left_insertion([1,2,4,5],6)==4", "assert left_insertion([1,2,4,5],3)==2",
          "assert left_insertion([1,2,4,5],7)==4"], crlf=True),
]


# ================================================================ 2. HumanEval

def body(text: str) -> str:
    """A canonical solution's body, indented under the prompt's signature."""
    return "    " + src(text).replace("\n", "\n    ").rstrip(" ")


def he(name, prompt, canonical, test, entry):
    prompt, test = src(prompt), src(test)
    return task("humaneval", name, prompt + body(canonical), [f"{test}\ncheck({entry})\n"], setup=prompt, entry=entry)


def he_rewrite(name, prompt, completion, test, entry):
    prompt, test = src(prompt), src(test)
    return task("humaneval", name, src(completion), [f"{test}\ncheck({entry})\n"], setup=prompt, entry=entry)


HUMANEVAL = [
    he("separate_paren_groups", r'''
        from typing import List


        def separate_paren_groups(paren_string: str) -> List[str]:
            """ Input to this function is a string containing multiple groups of nested parentheses. Your goal is to
            separate those group into separate strings and return the list of those.
            Separate groups are balanced (each open brace is properly closed) and not nested within each other
            Ignore any spaces in the input string.
            >>> separate_paren_groups('( ) (( )) (( )( ))')
            ['()', '(())', '(()())']
            """
        ''', r'''
        result = []
        current_string = []
        current_depth = 0

        for c in paren_string:
            if c == '(':
                current_depth += 1
                current_string.append(c)
            elif c == ')':
                current_depth -= 1
                current_string.append(c)

                if current_depth == 0:
                    result.append(''.join(current_string))
                    current_string.clear()

        return result
        ''', r'''


        METADATA = {
            'author': 'jt',
            'dataset': 'test'
        }


        def check(candidate):
            assert candidate('(()()) ((())) () ((())()())') == [
                '(()())', '((()))', '()', '((())()())'
            ]
            assert candidate('() (()) ((())) (((())))') == [
                '()', '(())', '((()))', '(((())))'
            ]
            assert candidate('(()(())((())))') == [
                '(()(())((())))'
            ]
            assert candidate('( ) (( )) (( )( ))') == ['()', '(())', '(()())']
        ''', "separate_paren_groups"),
    he("truncate_number-floats", r'''


        def truncate_number(number: float) -> float:
            """ Given a positive floating point number, it can be decomposed into
            and integer part (largest integer smaller than given number) and decimals
            (leftover part always smaller than 1).

            Return the decimal part of the number.
            >>> truncate_number(3.5)
            0.5
            """
        ''', r'''
        return number % 1.0
        ''', r'''


        METADATA = {
            'author': 'jt',
            'dataset': 'test'
        }


        def check(candidate):
            assert candidate(3.5) == 0.5
            assert abs(candidate(1.33) - 0.33) < 1e-6
            assert abs(candidate(123.456) - 0.456) < 1e-6
        ''', "truncate_number"),
    he("mean_absolute_deviation-generator", r'''
        from typing import List


        def mean_absolute_deviation(numbers: List[float]) -> float:
            """ For a given list of input numbers, calculate Mean Absolute Deviation
            around the mean of this dataset.
            Mean Absolute Deviation is the average absolute difference between each
            element and a centerpoint (mean in this case):
            MAD = average | x - x_mean |
            >>> mean_absolute_deviation([1.0, 2.0, 3.0, 4.0])
            1.0
            """
        ''', r'''
        mean = sum(numbers) / len(numbers)
        return sum(abs(x - mean) for x in numbers) / len(numbers)
        ''', r'''


        METADATA = {
            'author': 'jt',
            'dataset': 'test'
        }


        def check(candidate):
            assert abs(candidate([1.0, 2.0, 3.0]) - 2.0/3.0) < 1e-6
            assert abs(candidate([1.0, 2.0, 3.0, 4.0]) - 1.0) < 1e-6
            assert abs(candidate([1.0, 2.0, 3.0, 4.0, 5.0]) - 6.0/5.0) < 1e-6

        ''', "mean_absolute_deviation"),
    he("parse_nested_parens-inner-helper", r'''
        from typing import List


        def parse_nested_parens(paren_string: str) -> List[int]:
            """ Input to this function is a string represented multiple groups for nested parentheses separated by spaces.
            For each of the group, output the deepest level of nesting of parentheses.
            E.g. (()()) has maximum two levels of nesting while ((())) has three.

            >>> parse_nested_parens('(()()) ((())) () ((())()())')
            [2, 3, 1, 3]
            """
        ''', r'''
        def parse_paren_group(s):
            depth = 0
            max_depth = 0
            for c in s:
                if c == '(':
                    depth += 1
                    max_depth = max(depth, max_depth)
                else:
                    depth -= 1

            return max_depth

        return [parse_paren_group(x) for x in paren_string.split(' ') if x]
        ''', r'''


        METADATA = {
            'author': 'jt',
            'dataset': 'test'
        }


        def check(candidate):
            assert candidate('(()()) ((())) () ((())()())') == [2, 3, 1, 3]
            assert candidate('() (()) ((())) (((())))') == [1, 2, 3, 4]
            assert candidate('(()(())((())))') == [4]
        ''', "parse_nested_parens"),
    he("sum_product-tuple", r'''
        from typing import List, Tuple


        def sum_product(numbers: List[int]) -> Tuple[int, int]:
            """ For a given list of integers, return a tuple consisting of a sum and a product of all the integers in a list.
            Empty sum should be equal to 0 and empty product should be equal to 1.
            >>> sum_product([])
            (0, 1)
            >>> sum_product([1, 2, 3, 4])
            (10, 24)
            """
        ''', r'''
        sum_value = 0
        prod_value = 1

        for n in numbers:
            sum_value += n
            prod_value *= n
        return sum_value, prod_value
        ''', r'''


        METADATA = {
            'author': 'jt',
            'dataset': 'test'
        }


        def check(candidate):
            assert candidate([]) == (0, 1)
            assert candidate([1, 1, 1]) == (3, 1)
            assert candidate([100, 0]) == (100, 0)
            assert candidate([3, 5, 7]) == (3 + 5 + 7, 3 * 5 * 7)
            assert candidate([10]) == (10, 10)
        ''', "sum_product"),
    he("make_palindrome-prompt-helper", r'''


        def is_palindrome(string: str) -> bool:
            """ Test if given string is a palindrome """
            return string == string[::-1]


        def make_palindrome(string: str) -> str:
            """ Find the shortest palindrome that begins with a supplied string.
            Algorithm idea is simple:
            - Find the longest postfix of supplied string that is a palindrome.
            - Append to the end of the string reverse of a string prefix that comes before the palindromic suffix.
            >>> make_palindrome('')
            ''
            >>> make_palindrome('cat')
            'catac'
            >>> make_palindrome('cata')
            'catac'
            """
        ''', r'''
        if not string:
            return ''

        beginning_of_suffix = 0

        while not is_palindrome(string[beginning_of_suffix:]):
            beginning_of_suffix += 1

        return string + string[:beginning_of_suffix][::-1]
        ''', r'''


        METADATA = {
            'author': 'jt',
            'dataset': 'test'
        }


        def check(candidate):
            assert candidate('') == ''
            assert candidate('x') == 'x'
            assert candidate('xyz') == 'xyzyx'
            assert candidate('xyx') == 'xyx'
            assert candidate('jerry') == 'jerryrrej'
        ''', "make_palindrome"),
    he("string_xor-closure", r'''
        from typing import List


        def string_xor(a: str, b: str) -> str:
            """ Input are two strings a and b consisting only of 1s and 0s.
            Perform binary XOR on these inputs and return result also as a string.
            >>> string_xor('010', '110')
            '100'
            """
        ''', r'''
        def xor(i, j):
            if i == j:
                return '0'
            else:
                return '1'

        return ''.join(xor(x, y) for x, y in zip(a, b))
        ''', r'''


        METADATA = {
            'author': 'jt',
            'dataset': 'test'
        }


        def check(candidate):
            assert candidate('111000', '101010') == '010010'
            assert candidate('1', '1') == '0'
            assert candidate('0101', '0000') == '0101'
        ''', "string_xor"),
    he("longest-optional-none", r'''
        from typing import List, Optional


        def longest(strings: List[str]) -> Optional[str]:
            """ Out of list of strings, return the longest one. Return the first one in case of multiple
            strings of the same length. Return None in case the input list is empty.
            >>> longest([])

            >>> longest(['a', 'b', 'c'])
            'a'
            >>> longest(['a', 'bb', 'ccc'])
            'ccc'
            """
        ''', r'''
        if not strings:
            return None

        maxlen = max(len(x) for x in strings)
        for s in strings:
            if len(s) == maxlen:
                return s
        ''', r'''


        METADATA = {
            'author': 'jt',
            'dataset': 'test'
        }


        def check(candidate):
            assert candidate([]) == None
            assert candidate(['x', 'y', 'z']) == 'x'
            assert candidate(['x', 'yyy', 'zzzz', 'www', 'kkkk', 'abc']) == 'zzzz'
        ''', "longest"),
    he("sort_numbers-sorted-key-lambda", r'''
        from typing import List


        def sort_numbers(numbers: str) -> str:
            """ Input is a space-delimited string of numberals from 'zero' to 'nine'.
            Valid choices are 'zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight' and 'nine'.
            Return the string with numbers sorted from smallest to largest
            >>> sort_numbers('three one five')
            'one three five'
            """
        ''', r'''
        value_map = {
            'zero': 0,
            'one': 1,
            'two': 2,
            'three': 3,
            'four': 4,
            'five': 5,
            'six': 6,
            'seven': 7,
            'eight': 8,
            'nine': 9
        }
        return ' '.join(sorted([x for x in numbers.split(' ') if x], key=lambda x: value_map[x]))
        ''', r'''


        METADATA = {
            'author': 'jt',
            'dataset': 'test'
        }


        def check(candidate):
            assert candidate('') == ''
            assert candidate('three') == 'three'
            assert candidate('three five nine') == 'three five nine'
            assert candidate('five zero four seven nine eight') == 'zero four five seven eight nine'
            assert candidate('six five four three two one zero') == 'zero one two three four five six'
        ''', "sort_numbers"),
    he("find_closest_elements-float-tuple", r'''
        from typing import List, Tuple


        def find_closest_elements(numbers: List[float]) -> Tuple[float, float]:
            """ From a supplied list of numbers (of length at least two) select and return two that are the closest to each
            other and return them in order (smaller number, larger number).
            >>> find_closest_elements([1.0, 2.0, 3.0, 4.0, 5.0, 2.2])
            (2.0, 2.2)
            >>> find_closest_elements([1.0, 2.0, 3.0, 4.0, 5.0, 2.0])
            (2.0, 2.0)
            """
        ''', r'''
        closest_pair = None
        distance = None

        for idx, elem in enumerate(numbers):
            for idx2, elem2 in enumerate(numbers):
                if idx != idx2:
                    if distance is None:
                        distance = abs(elem - elem2)
                        closest_pair = tuple(sorted([elem, elem2]))
                    else:
                        new_distance = abs(elem - elem2)
                        if new_distance < distance:
                            distance = new_distance
                            closest_pair = tuple(sorted([elem, elem2]))

        return closest_pair
        ''', r'''


        METADATA = {
            'author': 'jt',
            'dataset': 'test'
        }


        def check(candidate):
            assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2]) == (3.9, 4.0)
            assert candidate([1.0, 2.0, 5.9, 4.0, 5.0]) == (5.0, 5.9)
            assert candidate([1.0, 2.0, 3.0, 4.0, 5.0, 2.2]) == (2.0, 2.2)
            assert candidate([1.0, 2.0, 3.0, 4.0, 5.0, 2.0]) == (2.0, 2.0)
            assert candidate([1.1, 2.2, 3.1, 4.1, 5.1]) == (2.2, 3.1)

        ''', "find_closest_elements"),
    he("decode_cyclic-setup-helper-random", r'''


        def encode_cyclic(s: str):
            """
            returns encoded string by cycling groups of three characters.
            """
            # split string to groups. Each of length 3.
            groups = [s[(3 * i):min((3 * i + 3), len(s))] for i in range((len(s) + 2) // 3)]
            # cycle elements in each group. Unless group has fewer elements than 3.
            groups = [(group[1:] + group[0]) if len(group) == 3 else group for group in groups]
            return "".join(groups)


        def decode_cyclic(s: str):
            """
            takes as input string encoded with encode_cyclic function. Returns decoded string.
            """
        ''', r'''
        return encode_cyclic(encode_cyclic(s))
        ''', r'''


        METADATA = {}


        def check(candidate):
            from random import randint, choice
            import string

            letters = string.ascii_lowercase
            for _ in range(100):
                str = ''.join(choice(letters) for i in range(randint(10, 20)))
                encoded_str = encode_cyclic(str)
                assert candidate(encoded_str) == str

        ''', "decode_cyclic"),
    he("find_zero-poly-floats", r'''
        import math


        def poly(xs: list, x: float):
            """
            Evaluates polynomial with coefficients xs at point x.
            return xs[0] + xs[1] * x + xs[1] * x^2 + .... xs[n] * x^n
            """
            return sum([coeff * math.pow(x, i) for i, coeff in enumerate(xs)])


        def find_zero(xs: list):
            """ xs are coefficients of a polynomial.
            find_zero find x such that poly(x) = 0.
            find_zero returns only only zero point, even if there are many.
            Moreover, find_zero only takes list xs having even number of coefficients
            and largest non zero coefficient as it guarantees
            a solution.
            >>> round(find_zero([1, 2]), 2) # f(x) = 1 + 2x
            -0.5
            >>> round(find_zero([-6, 11, -6, 1]), 2) # (x - 1) * (x - 2) * (x - 3) = -6 + 11x - 6x^2 + x^3
            1.0
            """
        ''', r'''
        begin, end = -1., 1.
        while poly(xs, begin) * poly(xs, end) > 0:
            begin *= 2.0
            end *= 2.0
        while end - begin > 1e-10:
            center = (begin + end) / 2.0
            if poly(xs, center) * poly(xs, begin) > 0:
                begin = center
            else:
                end = center
        return begin
        ''', r'''


        METADATA = {}


        def check(candidate):
            import math
            import random
            rng = random.Random(42)
            import copy
            for _ in range(100):
                ncoeff = 2 * rng.randint(1, 4)
                coeffs = []
                for _ in range(ncoeff):
                    coeff = rng.randint(-10, 10)
                    if coeff == 0:
                        coeff = 1
                    coeffs.append(coeff)
                solution = candidate(copy.deepcopy(coeffs))
                assert math.fabs(poly(coeffs, solution)) < 1e-4

        ''', "find_zero"),
    he("fib-recursion", r'''


        def fib(n: int):
            """Return n-th Fibonacci number.
            >>> fib(10)
            55
            >>> fib(1)
            1
            >>> fib(8)
            21
            """
        ''', r'''
        if n == 0:
            return 0
        if n == 1:
            return 1
        return fib(n - 1) + fib(n - 2)
        ''', r'''


        METADATA = {}


        def check(candidate):
            assert candidate(10) == 55
            assert candidate(1) == 1
            assert candidate(8) == 21
            assert candidate(11) == 89
            assert candidate(12) == 144

        ''', "fib"),
    he("prime_fib-nested-import", r'''


        def prime_fib(n: int):
            """
            prime_fib returns n-th number that is a Fibonacci number and it's also prime.
            >>> prime_fib(1)
            2
            >>> prime_fib(2)
            3
            >>> prime_fib(3)
            5
            >>> prime_fib(4)
            13
            >>> prime_fib(5)
            89
            """
        ''', r'''
        import math

        def is_prime(p):
            if p < 2:
                return False
            for k in range(2, min(int(math.sqrt(p)) + 1, p - 1)):
                if p % k == 0:
                    return False
            return True
        f = [0, 1]
        while True:
            f.append(f[-1] + f[-2])
            if is_prime(f[-1]):
                n -= 1
            if n == 0:
                return f[-1]
        ''', r'''


        METADATA = {}


        def check(candidate):
            assert candidate(1) == 2
            assert candidate(2) == 3
            assert candidate(3) == 5
            assert candidate(4) == 13
            assert candidate(5) == 89
            assert candidate(6) == 233
            assert candidate(7) == 1597
            assert candidate(8) == 28657
            assert candidate(9) == 514229
            assert candidate(10) == 433494437

        ''', "prime_fib"),
    he("triangle_area-rounded-floats", r"""

        def triangle_area(a, b, c):
            '''
            Given the lengths of the three sides of a triangle. Return the area of
            the triangle rounded to 2 decimal points if the three sides form a valid triangle.
            Otherwise return -1
            Three sides make a valid triangle when the sum of any two sides is greater
            than the third side.
            Example:
            triangle_area(3, 4, 5) == 6.00
            triangle_area(1, 2, 10) == -1
            '''
        """, r'''
        if a + b <= c or a + c <= b or b + c <= a:
            return -1
        s = (a + b + c)/2
        area = (s * (s - a) * (s - b) * (s - c)) ** 0.5
        area = round(area, 2)
        return area
        ''', r'''
        def check(candidate):

            # Check some simple cases
            assert candidate(3, 4, 5) == 6.00, "This prints if this assert fails 1 (good for debugging!)"
            assert candidate(1, 2, 10) == -1
            assert candidate(4, 8, 5) == 8.18
            assert candidate(2, 2, 2) == 1.73
            assert candidate(1, 2, 3) == -1
            assert candidate(10, 5, 7) == 16.25
            assert candidate(2, 6, 3) == -1

            # Check some edge cases that are easy to work out by hand.
            assert candidate(1, 1, 1) == 0.43, "This prints if this assert fails 2 (also good for debugging!)"
            assert candidate(2, 2, 10) == -1

        ''', "triangle_area"),
    he("order_by_points-sorted-key-helper", r'''

        def order_by_points(nums):
            """
            Write a function which sorts the given list of integers
            in ascending order according to the sum of their digits.
            Note: if there are several items with similar sum of their digits,
            order them based on their index in original list.

            For example:
            >>> order_by_points([1, 11, -1, -11, -12]) == [-1, -11, 1, -12, 11]
            >>> order_by_points([]) == []
            """
        ''', r'''
        def digits_sum(n):
            neg = 1
            if n < 0: n, neg = -1 * n, -1
            n = [int(i) for i in str(n)]
            n[0] = n[0] * neg
            return sum(n)
        return sorted(nums, key=digits_sum)
        ''', r'''
        def check(candidate):

            # Check some simple cases
            assert candidate([1, 11, -1, -11, -12]) == [-1, -11, 1, -12, 11]
            assert candidate([1234,423,463,145,2,423,423,53,6,37,3457,3,56,0,46]) == [0, 2, 3, 6, 53, 423, 423, 423, 1234, 145, 37, 46, 56, 463, 3457]
            assert candidate([]) == []
            assert candidate([1, -11, -32, 43, 54, -98, 2, -3]) == [-3, -32, -98, -11, 1, 2, 43, 54]
            assert candidate([1,2,3,4,5,6,7,8,9,10,11]) == [1, 10, 2, 11, 3, 4, 5, 6, 7, 8, 9]
            assert candidate([0,6,6,-76,-21,23,4]) == [-76, -21, 0, 4, 23, 6, 6]

            # Check some edge cases that are easy to work out by hand.
            assert True, "This prints if this assert fails 2 (also good for debugging!)"

        ''', "order_by_points"),
    he("circular_shift-str-formatting", r'''

        def circular_shift(x, shift):
            """Circular shift the digits of the integer x, shift the digits right by shift
            and return the result as a string.
            If shift > number of digits, return digits reversed.
            >>> circular_shift(12, 1)
            "21"
            >>> circular_shift(12, 2)
            "12"
            """
        ''', r'''
        s = str(x)
        if shift > len(s):
            return s[::-1]
        else:
            return s[len(s) - shift:] + s[:len(s) - shift]
        ''', r'''
        def check(candidate):

            # Check some simple cases
            assert candidate(100, 2) == "001"
            assert candidate(12, 2) == "12"
            assert candidate(97, 8) == "79"
            assert candidate(12, 1) == "21", "This prints if this assert fails 1 (good for debugging!)"

            # Check some edge cases that are easy to work out by hand.
            assert candidate(11, 101) == "11", "This prints if this assert fails 2 (also good for debugging!)"

        ''', "circular_shift"),
    he("by_length-dict-lookup", r'''

        def by_length(arr):
            """
            Given an array of integers, sort the integers that are between 1 and 9 inclusive,
            reverse the resulting array, and then replace each digit by its corresponding name from
            "One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine".

            For example:
              arr = [2, 1, 1, 4, 5, 8, 2, 3]
                    -> sort arr -> [1, 1, 2, 2, 3, 4, 5, 8]
                    -> reverse arr -> [8, 5, 4, 3, 2, 2, 1, 1]
              return ["Eight", "Five", "Four", "Three", "Two", "Two", "One", "One"]
            """
        ''', r'''
        dic = {
            1: "One",
            2: "Two",
            3: "Three",
            4: "Four",
            5: "Five",
            6: "Six",
            7: "Seven",
            8: "Eight",
            9: "Nine",
        }
        sorted_arr = sorted(arr, reverse=True)
        new_arr = []
        for var in sorted_arr:
            try:
                new_arr.append(dic[var])
            except:
                pass
        return new_arr
        ''', r'''
        def check(candidate):

            # Check some simple cases
            assert True, "This prints if this assert fails 1 (good for debugging!)"
            assert candidate([2, 1, 1, 4, 5, 8, 2, 3]) == ["Eight", "Five", "Four", "Three", "Two", "Two", "One", "One"], "Error"
            assert candidate([]) == [], "Error"
            assert candidate([1, -1 , 55]) == ['One'], "Error"

            # Check some edge cases that are easy to work out by hand.
            assert True, "This prints if this assert fails 2 (also good for debugging!)"
            assert candidate([1, -1, 3, 2]) == ["Three", "Two", "One"]
            assert candidate([9, 4, 8]) == ["Nine", "Eight", "Four"]

        ''', "by_length"),
    he_rewrite("rolling_max-model-rewrite-accumulate", r'''
        from typing import List, Tuple


        def rolling_max(numbers: List[int]) -> List[int]:
            """ From a given list of integers, generate a list of rolling maximum element found until given moment
            in the sequence.
            >>> rolling_max([1, 2, 3, 2, 3, 4, 2])
            [1, 2, 3, 3, 3, 4, 4]
            """
        ''', r'''
        from itertools import accumulate
        from typing import List


        def rolling_max(numbers: List[int]) -> List[int]:
            """Running maximum of the sequence."""
            return list(accumulate(numbers, max))
        ''', r'''


        METADATA = {
            'author': 'jt',
            'dataset': 'test'
        }


        def check(candidate):
            assert candidate([]) == []
            assert candidate([1, 2, 3, 4]) == [1, 2, 3, 4]
            assert candidate([4, 3, 2, 1]) == [4, 4, 4, 4]
            assert candidate([3, 2, 3, 100, 3]) == [3, 3, 3, 100, 100]
        ''', "rolling_max"),
    he_rewrite("even_odd_palindrome-model-rewrite-generators", r'''

        def even_odd_palindrome(n):
            """
            Given a positive integer n, return a tuple that has the number of even and odd
            integer palindromes that fall within the range(1, n), inclusive.

            Example 1:

                Input: 3
                Output: (1, 2)
                Explanation:
                Integer palindrome are 1, 2, 3. one of them is even, and two of them are odd.
            """
        ''', r'''
        def is_palindrome(num: int) -> bool:
            s = str(num)
            return s == s[::-1]


        def even_odd_palindrome(n):
            palindromes = [k for k in range(1, n + 1) if is_palindrome(k)]
            even = sum(1 for k in palindromes if k % 2 == 0)
            odd = sum(1 for k in palindromes if k % 2 == 1)
            return (even, odd)
        ''', r'''
        def check(candidate):

            # Check some simple cases
            assert candidate(123) == (8, 13)
            assert candidate(12) == (4, 6)
            assert candidate(3) == (1, 2)
            assert candidate(63) == (6, 8)
            assert candidate(25) == (5, 6)
            assert candidate(19) == (4, 6)
            assert candidate(9) == (4, 5), "This prints if this assert fails 1 (good for debugging!)"

            # Check some edge cases that are easy to work out by hand.
            assert candidate(1) == (0, 1), "This prints if this assert fails 2 (also good for debugging!)"

        ''', "even_odd_palindrome"),
    he_rewrite("decimal_to_binary-fstring-rewrite", r'''

        def decimal_to_binary(decimal):
            """You will be given a number in decimal form and your task is to convert it to
            binary format. The function should return a string, with each character representing a binary
            number. Each character in the string will be '0' or '1'.

            There will be an extra couple of characters 'db' at the beginning and at the end of the string.
            The extra characters are there to help with the format.

            Examples:
            decimal_to_binary(15)   # returns "db1111db"
            decimal_to_binary(32)   # returns "db100000db"
            """
        ''', r'''
        def decimal_to_binary(decimal):
            return f"db{decimal:b}db"
        ''', r'''
        def check(candidate):

            # Check some simple cases
            assert candidate(0) == "db0db"
            assert candidate(32) == "db100000db"
            assert candidate(103) == "db1100111db"
            assert candidate(15) == "db1111db", "This prints if this assert fails 1 (good for debugging!)"

            # Check some edge cases that are easy to work out by hand.
            assert True, "This prints if this assert fails 2 (also good for debugging!)"

        ''', "decimal_to_binary"),
    he("compare_one-mixed-types-none", r'''

        def compare_one(a, b):
            """
            Create a function that takes integers, floats, or strings representing
            real numbers, and returns the larger variable in its given variable type.
            Return None if the values are equal.
            Note: If a real number is represented as a string, the floating point might be . or ,

            compare_one(1, 2.5) ➞ 2.5
            compare_one(1, "2,3") ➞ "2,3"
            compare_one("5,1", "6") ➞ "6"
            compare_one("1", 1) ➞ None
            """
        ''', r'''
        temp_a, temp_b = a, b
        if isinstance(temp_a, str): temp_a = temp_a.replace(',','.')
        if isinstance(temp_b, str): temp_b = temp_b.replace(',','.')
        if float(temp_a) == float(temp_b): return None
        return a if float(temp_a) > float(temp_b) else b
        ''', r'''
        def check(candidate):

            # Check some simple cases
            assert candidate(1, 2) == 2
            assert candidate(1, 2.5) == 2.5
            assert candidate(2, 3) == 3
            assert candidate(5, 6) == 6
            assert candidate(1, "2,3") == "2,3"
            assert candidate("5,1", "6") == "6"
            assert candidate("1", "2") == "2"
            assert candidate("1", 1) == None

            # Check some edge cases that are easy to work out by hand.
            assert True

        ''', "compare_one"),
    he("filter_integers-List-Any", r'''
        from typing import List, Any


        def filter_integers(values: List[Any]) -> List[int]:
            """ Filter given list of any python values only for integers
            >>> filter_integers(['a', 3.14, 5])
            [5]
            >>> filter_integers([1, 2, 3, 'abc', {}, []])
            [1, 2, 3]
            """
        ''', r'''
        return [x for x in values if isinstance(x, int)]
        ''', r'''


        METADATA = {
            'author': 'jt',
            'dataset': 'test'
        }


        def check(candidate):
            assert candidate([]) == []
            assert candidate([4, {}, [], 23.2, 9, 'adasd']) == [4, 9]
            assert candidate([3, 'c', 3, 3, 'a', 'b']) == [3, 3, 3]
        ''', "filter_integers"),
    he("median-float-result", r'''


        def median(l: list):
            """Return median of elements in the list l.
            >>> median([3, 1, 2, 4, 5])
            3
            >>> median([-10, 4, 6, 1000, 10, 20])
            15.0
            """
        ''', r'''
        l = sorted(l)
        if len(l) % 2 == 1:
            return l[len(l) // 2]
        else:
            return (l[len(l) // 2 - 1] + l[len(l) // 2]) / 2.0
        ''', r'''


        METADATA = {}


        def check(candidate):
            assert candidate([3, 1, 2, 4, 5]) == 3
            assert candidate([-10, 4, 6, 1000, 10, 20]) == 8.0
            assert candidate([5]) == 5
            assert candidate([6, 5]) == 5.5
            assert candidate([8, 1, 3, 9, 9, 2, 7]) == 7

        ''', "median"),
    he("add-random-in-check", r'''


        def add(x: int, y: int):
            """Add two numbers x and y
            >>> add(2, 3)
            5
            >>> add(5, 7)
            12
            """
        ''', r'''
        return x + y
        ''', r'''


        METADATA = {}


        def check(candidate):
            import random

            assert candidate(0, 1) == 1
            assert candidate(1, 0) == 1
            assert candidate(2, 3) == 5
            assert candidate(5, 7) == 12
            assert candidate(7, 5) == 12

            for i in range(100):
                x, y = random.randint(0, 1000), random.randint(0, 1000)
                assert candidate(x, y) == x + y

        ''', "add"),
    he("get_row-tuples-sorted-twice", r'''

        def get_row(lst, x):
            """
            You are given a 2 dimensional data, as a nested lists,
            which is similar to matrix, however, unlike matrices,
            each row may contain a different number of columns.
            Given lst, and integer x, find integers x in the list,
            and return list of tuples, [(x1, y1), (x2, y2) ...] such that
            each tuple is a coordinate - (row, columns), starting with 0.
            Sort coordinates initially by rows in ascending order.
            Also, sort coordinates of the row by columns in descending order.
            """
        ''', r'''
        coords = [(i, j) for i in range(len(lst)) for j in range(len(lst[i])) if lst[i][j] == x]
        return sorted(sorted(coords, key=lambda x: x[1], reverse=True), key=lambda x: x[0])
        ''', r'''
        def check(candidate):

            # Check some simple cases
            assert candidate([
                [1,2,3,4,5,6],
                [1,2,3,4,1,6],
                [1,2,3,4,5,1]
            ], 1) == [(0, 0), (1, 4), (1, 0), (2, 5), (2, 0)]
            assert candidate([
                [1,2,3,4,5,6],
                [1,2,3,4,5,6],
                [1,2,3,4,5,6],
                [1,2,3,4,5,6],
                [1,2,3,4,5,6],
                [1,2,3,4,5,6]
            ], 2) == [(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1)]
            assert candidate([], 1) == []
            assert candidate([[1]], 2) == []
            assert candidate([[], [1], [1, 2, 3]], 3) == [(2, 2)]

            # Check some edge cases that are easy to work out by hand.
            assert True

        ''', "get_row"),
    he("do_algebra-eval-in-completion", r'''

        def do_algebra(operator, operand):
            """
            Given two lists operator, and operand. The first list has basic algebra operations, and
            the second list is a list of integers. Use the two given lists to build the algebric
            expression and return the evaluation of this expression.
            """
        ''', r'''
        expression = str(operand[0])
        for oprt, oprn in zip(operator, operand[1:]):
            expression+= oprt + str(oprn)
        return eval(expression)
        ''', r'''
        def check(candidate):

            # Check some simple cases
            assert candidate(['**', '*', '+'], [2, 3, 4, 5]) == 37
            assert candidate(['+', '*', '-'], [2, 3, 4, 5]) == 9
            assert candidate(['//', '*'], [7, 3, 4]) == 8, "This prints if this assert fails 1 (good for debugging!)"

            # Check some edge cases that are easy to work out by hand.
            assert True, "This prints if this assert fails 2 (also good for debugging!)"

        ''', "do_algebra"),
]


# ================================================================ 3. LeetCode

# LeetCodeDataset's prelude (the "prompt" every problem carries): star imports and the helpers.
LC_PRELUDE = src(r'''
    import random
    import functools
    import collections
    import string
    import math
    import datetime

    from typing import *
    from functools import *
    from collections import *
    from itertools import *
    from heapq import *
    from bisect import *
    from string import *
    from operator import *
    from math import *

    inf = float('inf')

    class ListNode:
        def __init__(self, val=0, next=None):
            self.val = val
            self.next = next

    def list_node(values: list):
        if not values:
            return None
        head = ListNode(values[0])
        p = head
        for val in values[1:]:
            node = ListNode(val)
            p.next = node
            p = node
        return head

    def is_same_list(p1, p2):
        if p1 is None and p2 is None:
            return True
        if not p1 or not p2:
            return False
        return p1.val == p2.val and is_same_list(p1.next, p2.next)

    class TreeNode:
        def __init__(self, val=0, left=None, right=None):
            self.val = val
            self.left = left
            self.right = right

    def tree_node(values: list):
        if not values:
            return None
        root = TreeNode(values[0])
        i = 1
        queue = deque()
        queue.append(root)
        while queue:
            node = queue.popleft()
            if i < len(values) and values[i] is not None:
                node.left = TreeNode(values[i])
                queue.append(node.left)
            i += 1
            if i < len(values) and values[i] is not None:
                node.right = TreeNode(values[i])
                queue.append(node.right)
            i += 1
        return root

    def is_same_tree(p, q):
        if not p and not q:
            return True
        elif not p or not q:
            return False
        elif p.val != q.val:
            return False
        else:
            return is_same_tree(p.left, q.left) and is_same_tree(p.right, q.right)
''')

# A plain judge harness: typing, the node classes and builders, nothing else.
LC_PLAIN = src(r'''
    from typing import List, Optional


    class ListNode:
        def __init__(self, val=0, next=None):
            self.val = val
            self.next = next


    class TreeNode:
        def __init__(self, val=0, left=None, right=None):
            self.val = val
            self.left = left
            self.right = right


    def build_list(values):
        dummy = ListNode()
        cur = dummy
        for v in values:
            cur.next = ListNode(v)
            cur = cur.next
        return dummy.next


    def list_values(head):
        out = []
        while head:
            out.append(head.val)
            head = head.next
        return out


    def build_tree(values):
        if not values or values[0] is None:
            return None
        nodes = [None if v is None else TreeNode(v) for v in values]
        kids = nodes[::-1]
        root = kids.pop()
        for node in nodes:
            if node:
                if kids:
                    node.left = kids.pop()
                if kids:
                    node.right = kids.pop()
        return root
''')


def lc(name, code, tests, *, prelude=LC_PRELUDE, entry="Solution"):
    return task("leetcode", name, src(code), [src(t) for t in tests], setup=prelude, entry=entry)


def lc_check(name, code, check, method):
    """LeetCodeDataset's form: ``def check(candidate)`` then ``check(Solution().method)``."""
    return lc(name, code, [src(check) + f"\ncheck(Solution().{method})\n"])


LEETCODE = [
    lc_check("twoSum-hashmap", '''
        class Solution:
            def twoSum(self, nums: List[int], target: int) -> List[int]:
                d = {}
                for i, x in enumerate(nums):
                    y = target - x
                    if y in d:
                        return [d[y], i]
                    d[x] = i
        ''', '''
        def check(candidate):
            assert candidate(nums = [2,7,11,15], target = 9) == [0,1]
            assert candidate(nums = [3,2,4], target = 6) == [1,2]
            assert candidate(nums = [3,3], target = 6) == [0,1]
        ''', "twoSum"),
    lc_check("addTwoNumbers-linked-list-return", '''
        # Definition for singly-linked list.
        # class ListNode:
        #     def __init__(self, val=0, next=None):
        #         self.val = val
        #         self.next = next
        class Solution:
            def addTwoNumbers(
                self, l1: Optional[ListNode], l2: Optional[ListNode]
            ) -> Optional[ListNode]:
                dummy = ListNode()
                carry, curr = 0, dummy
                while l1 or l2 or carry:
                    s = (l1.val if l1 else 0) + (l2.val if l2 else 0) + carry
                    carry, val = divmod(s, 10)
                    curr.next = ListNode(val)
                    curr = curr.next
                    l1 = l1.next if l1 else None
                    l2 = l2.next if l2 else None
                return dummy.next
        ''', '''
        def check(candidate):
            assert is_same_list(candidate(l1 = list_node([2,4,3]), l2 = list_node([5,6,4])), list_node([7,0,8]))
            assert is_same_list(candidate(l1 = list_node([0]), l2 = list_node([0])), list_node([0]))
            assert is_same_list(candidate(l1 = list_node([9,9,9,9,9,9,9]), l2 = list_node([9,9,9,9])), list_node([8,9,9,9,0,0,0,1]))
        ''', "addTwoNumbers"),
    lc_check("mergeTwoLists-recursion", '''
        class Solution:
            def mergeTwoLists(
                self, list1: Optional[ListNode], list2: Optional[ListNode]
            ) -> Optional[ListNode]:
                if list1 is None or list2 is None:
                    return list1 or list2
                if list1.val <= list2.val:
                    list1.next = self.mergeTwoLists(list1.next, list2)
                    return list1
                else:
                    list2.next = self.mergeTwoLists(list1, list2.next)
                    return list2
        ''', '''
        def check(candidate):
            assert is_same_list(candidate(list1 = list_node([1,2,4]), list2 = list_node([1,3,4])), list_node([1,1,2,3,4,4]))
            assert is_same_list(candidate(list1 = list_node([]), list2 = list_node([])), list_node([]))
            assert is_same_list(candidate(list1 = list_node([]), list2 = list_node([0])), list_node([0]))
        ''', "mergeTwoLists"),
    lc_check("inorderTraversal-tree", '''
        # Definition for a binary tree node.
        # class TreeNode:
        #     def __init__(self, val=0, left=None, right=None):
        #         self.val = val
        #         self.left = left
        #         self.right = right
        class Solution:
            def inorderTraversal(self, root: Optional[TreeNode]) -> List[int]:
                def dfs(root):
                    if root is None:
                        return
                    dfs(root.left)
                    ans.append(root.val)
                    dfs(root.right)

                ans = []
                dfs(root)
                return ans
        ''', '''
        def check(candidate):
            assert candidate(root = tree_node([1,None,2,3])) == [1,3,2]
            assert candidate(root = tree_node([])) == []
            assert candidate(root = tree_node([1])) == [1]
            assert candidate(root = tree_node([1,2,3,4,5,None,8,None,None,6,7,9])) == [4,2,6,5,7,1,3,9,8]
        ''', "inorderTraversal"),
    lc_check("levelOrder-deque", '''
        class Solution:
            def levelOrder(self, root: Optional[TreeNode]) -> List[List[int]]:
                ans = []
                if root is None:
                    return ans
                q = deque([root])
                while q:
                    t = []
                    for _ in range(len(q)):
                        node = q.popleft()
                        t.append(node.val)
                        if node.left:
                            q.append(node.left)
                        if node.right:
                            q.append(node.right)
                    ans.append(t)
                return ans
        ''', '''
        def check(candidate):
            assert candidate(root = tree_node([3,9,20,None,None,15,7])) == [[3],[9,20],[15,7]]
            assert candidate(root = tree_node([1])) == [[1]]
            assert candidate(root = tree_node([])) == []
        ''', "levelOrder"),
    lc_check("invertTree-tree-return", '''
        class Solution:
            def invertTree(self, root: Optional[TreeNode]) -> Optional[TreeNode]:
                if root is None:
                    return None
                l, r = self.invertTree(root.left), self.invertTree(root.right)
                root.left, root.right = r, l
                return root
        ''', '''
        def check(candidate):
            assert is_same_tree(candidate(root = tree_node([4,2,7,1,3,6,9])), tree_node([4,7,2,9,6,3,1]))
            assert is_same_tree(candidate(root = tree_node([2,1,3])), tree_node([2,3,1]))
            assert is_same_tree(candidate(root = tree_node([])), tree_node([]))
        ''', "invertTree"),
    lc_check("isValidBST-inf", '''
        class Solution:
            def isValidBST(self, root: Optional[TreeNode]) -> bool:
                def dfs(root: Optional[TreeNode]) -> bool:
                    if root is None:
                        return True
                    if not dfs(root.left):
                        return False
                    nonlocal prev
                    if prev >= root.val:
                        return False
                    prev = root.val
                    return dfs(root.right)

                prev = -inf
                return dfs(root)
        ''', '''
        def check(candidate):
            assert candidate(root = tree_node([2,1,3])) == True
            assert candidate(root = tree_node([5,1,4,None,None,3,6])) == False
            assert candidate(root = tree_node([5,4,6,None,None,3,7])) == False
        ''', "isValidBST"),
    lc_check("findKthLargest-heapq", '''
        import heapq

        class Solution:
            def findKthLargest(self, nums: List[int], k: int) -> int:
                heap = []
                for x in nums:
                    heapq.heappush(heap, x)
                    if len(heap) > k:
                        heapq.heappop(heap)
                return heap[0]
        ''', '''
        def check(candidate):
            assert candidate(nums = [3,2,1,5,6,4], k = 2) == 5
            assert candidate(nums = [3,2,3,1,2,4,5,5,6], k = 4) == 4
        ''', "findKthLargest"),
    lc_check("topKFrequent-counter-nlargest", '''
        class Solution:
            def topKFrequent(self, nums: List[int], k: int) -> List[int]:
                cnt = Counter(nums)
                return [x for x, _ in nlargest(k, cnt.items(), key=lambda x: x[1])]
        ''', '''
        def check(candidate):
            assert candidate(nums = [1,1,1,2,2,3], k = 2) == [1,2]
            assert candidate(nums = [1], k = 1) == [1]
        ''', "topKFrequent"),
    lc_check("climbStairs-cache-on-method", '''
        from functools import cache

        class Solution:
            @cache
            def climbStairs(self, n: int) -> int:
                if n <= 2:
                    return n
                return self.climbStairs(n - 1) + self.climbStairs(n - 2)
        ''', '''
        def check(candidate):
            assert candidate(n = 2) == 2
            assert candidate(n = 3) == 3
            assert candidate(n = 45) == 1836311903
        ''', "climbStairs"),
    lc_check("wordBreak-lru_cache-inner", '''
        import functools

        class Solution:
            def wordBreak(self, s: str, wordDict: List[str]) -> bool:
                words = set(wordDict)

                @functools.lru_cache(maxsize=None)
                def can(i: int) -> bool:
                    if i == len(s):
                        return True
                    return any(s[i:j] in words and can(j) for j in range(i + 1, len(s) + 1))

                return can(0)
        ''', '''
        def check(candidate):
            assert candidate(s = "leetcode", wordDict = ["leet","code"]) == True
            assert candidate(s = "applepenapple", wordDict = ["apple","pen"]) == True
            assert candidate(s = "catsandog", wordDict = ["cats","dog","sand","and","cat"]) == False
        ''', "wordBreak"),
    lc_check("searchInsert-bisect", '''
        class Solution:
            def searchInsert(self, nums: List[int], target: int) -> int:
                return bisect_left(nums, target)
        ''', '''
        def check(candidate):
            assert candidate(nums = [1,3,5,6], target = 5) == 2
            assert candidate(nums = [1,3,5,6], target = 2) == 1
            assert candidate(nums = [1,3,5,6], target = 7) == 4
        ''', "searchInsert"),
    lc_check("networkDelayTime-dijkstra", '''
        class Solution:
            def networkDelayTime(self, times: List[List[int]], n: int, k: int) -> int:
                g = defaultdict(list)
                for u, v, w in times:
                    g[u].append((v, w))
                dist = [inf] * (n + 1)
                dist[k] = 0
                pq = [(0, k)]
                while pq:
                    d, u = heappop(pq)
                    if d > dist[u]:
                        continue
                    for v, w in g[u]:
                        if d + w < dist[v]:
                            dist[v] = d + w
                            heappush(pq, (dist[v], v))
                ans = max(dist[1:])
                return -1 if ans == inf else ans
        ''', '''
        def check(candidate):
            assert candidate(times = [[2,1,1],[2,3,1],[3,4,1]], n = 4, k = 2) == 2
            assert candidate(times = [[1,2,1]], n = 2, k = 1) == 1
            assert candidate(times = [[1,2,1]], n = 2, k = 2) == -1
        ''', "networkDelayTime"),
    lc("sortColors-in-place", '''
        class Solution:
            def sortColors(self, nums: List[int]) -> None:
                """
                Do not return anything, modify nums in-place instead.
                """
                i, j, k = -1, len(nums), 0
                while k < j:
                    if nums[k] == 0:
                        i += 1
                        nums[i], nums[k] = nums[k], nums[i]
                        k += 1
                    elif nums[k] == 2:
                        j -= 1
                        nums[j], nums[k] = nums[k], nums[j]
                    else:
                        k += 1
        ''', ['''
        nums = [2,0,2,1,1,0]
        assert Solution().sortColors(nums) is None
        assert nums == [0,0,1,1,2,2]
        ''', '''
        nums = [2,0,1]
        Solution().sortColors(nums)
        assert nums == [0,1,2]
        '''], prelude=LC_PLAIN),
    lc("rotate-matrix-in-place", '''
        class Solution:
            def rotate(self, matrix: List[List[int]]) -> None:
                """
                Do not return anything, modify matrix in-place instead.
                """
                n = len(matrix)
                for i in range(n >> 1):
                    for j in range(n):
                        matrix[i][j], matrix[n - i - 1][j] = matrix[n - i - 1][j], matrix[i][j]
                for i in range(n):
                    for j in range(i):
                        matrix[i][j], matrix[j][i] = matrix[j][i], matrix[i][j]
        ''', ['''
        matrix = [[1,2,3],[4,5,6],[7,8,9]]
        Solution().rotate(matrix)
        assert matrix == [[7,4,1],[8,5,2],[9,6,3]]
        ''', '''
        matrix = [[5,1,9,11],[2,4,8,10],[13,3,6,7],[15,14,12,16]]
        Solution().rotate(matrix)
        assert matrix == [[15,13,2,5],[14,3,4,1],[12,6,8,9],[16,7,10,11]]
        '''], prelude=LC_PLAIN),
    lc("merge-sorted-array-in-place", '''
        class Solution:
            def merge(self, nums1: List[int], m: int, nums2: List[int], n: int) -> None:
                """
                Do not return anything, modify nums1 in-place instead.
                """
                k = m + n - 1
                i, j = m - 1, n - 1
                while j >= 0:
                    if i >= 0 and nums1[i] > nums2[j]:
                        nums1[k] = nums1[i]
                        i -= 1
                    else:
                        nums1[k] = nums2[j]
                        j -= 1
                    k -= 1
        ''', ['''
        nums1 = [1,2,3,0,0,0]
        nums2 = [2,5,6]
        Solution().merge(nums1, 3, nums2, 3)
        assert nums1 == [1,2,2,3,5,6] and nums2 == [2,5,6]
        ''', '''
        nums1 = [0]
        Solution().merge(nums1, 0, [1], 1)
        assert nums1 == [1]
        '''], prelude=LC_PLAIN),
    lc("reverseList-in-place-nodes", '''
        class Solution:
            def reverseList(self, head: Optional[ListNode]) -> Optional[ListNode]:
                prev = None
                curr = head
                while curr:
                    nxt = curr.next
                    curr.next = prev
                    prev = curr
                    curr = nxt
                return prev
        ''', ['''
        head = build_list([1, 2, 3, 4, 5])
        first = head
        rev = Solution().reverseList(head)
        assert list_values(rev) == [5, 4, 3, 2, 1]
        assert first.next is None and rev.next.next.next.next is first
        ''', '''
        assert Solution().reverseList(None) is None
        assert list_values(Solution().reverseList(build_list([1, 2]))) == [2, 1]
        '''], prelude=LC_PLAIN),
    lc("removeNthFromEnd-two-pointers", '''
        class Solution:
            def removeNthFromEnd(self, head: Optional[ListNode], n: int) -> Optional[ListNode]:
                dummy = ListNode(next=head)
                fast = slow = dummy
                for _ in range(n):
                    fast = fast.next
                while fast.next:
                    slow, fast = slow.next, fast.next
                slow.next = slow.next.next
                return dummy.next
        ''', ['''
        assert list_values(Solution().removeNthFromEnd(build_list([1,2,3,4,5]), 2)) == [1,2,3,5]
        assert list_values(Solution().removeNthFromEnd(build_list([1]), 1)) == []
        assert list_values(Solution().removeNthFromEnd(build_list([1,2]), 1)) == [1]
        '''], prelude=LC_PLAIN),
    lc("hasCycle-cycle-built-by-test", '''
        class Solution:
            def hasCycle(self, head: Optional[ListNode]) -> bool:
                slow = fast = head
                while fast and fast.next:
                    slow, fast = slow.next, fast.next.next
                    if slow == fast:
                        return True
                return False
        ''', ['''
        head = build_list([3, 2, 0, -4])
        tail = head
        while tail.next:
            tail = tail.next
        tail.next = head.next
        assert Solution().hasCycle(head) is True
        ''', '''
        assert Solution().hasCycle(build_list([1])) is False
        assert Solution().hasCycle(None) is False
        '''], prelude=LC_PLAIN),
    lc("maxDepth-recursive-plain-builder", '''
        class Solution:
            def maxDepth(self, root: Optional[TreeNode]) -> int:
                if root is None:
                    return 0
                return 1 + max(self.maxDepth(root.left), self.maxDepth(root.right))
        ''', ['''
        assert Solution().maxDepth(build_tree([3, 9, 20, None, None, 15, 7])) == 3
        assert Solution().maxDepth(build_tree([1, None, 2])) == 2
        assert Solution().maxDepth(None) == 0
        '''], prelude=LC_PLAIN),
    lc("numIslands-grid-bfs-mutates", '''
        from collections import deque

        class Solution:
            def numIslands(self, grid: List[List[str]]) -> int:
                rows, cols = len(grid), len(grid[0])
                count = 0
                for r in range(rows):
                    for c in range(cols):
                        if grid[r][c] != "1":
                            continue
                        count += 1
                        grid[r][c] = "0"
                        q = deque([(r, c)])
                        while q:
                            i, j = q.popleft()
                            for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                                x, y = i + di, j + dj
                                if 0 <= x < rows and 0 <= y < cols and grid[x][y] == "1":
                                    grid[x][y] = "0"
                                    q.append((x, y))
                return count
        ''', ['''
        grid = [
          ["1","1","1","1","0"],
          ["1","1","0","1","0"],
          ["1","1","0","0","0"],
          ["0","0","0","0","0"]
        ]
        assert Solution().numIslands(grid) == 1
        ''', '''
        grid = [
          ["1","1","0","0","0"],
          ["1","1","0","0","0"],
          ["0","0","1","0","0"],
          ["0","0","0","1","1"]
        ]
        assert Solution().numIslands(grid) == 3
        '''], prelude=LC_PLAIN),
    lc("LRUCache-design-ordereddict", '''
        from collections import OrderedDict

        class LRUCache:

            def __init__(self, capacity: int):
                self.capacity = capacity
                self.cache = OrderedDict()

            def get(self, key: int) -> int:
                if key not in self.cache:
                    return -1
                self.cache.move_to_end(key)
                return self.cache[key]

            def put(self, key: int, value: int) -> None:
                if key in self.cache:
                    self.cache.move_to_end(key)
                self.cache[key] = value
                if len(self.cache) > self.capacity:
                    self.cache.popitem(last=False)


        # Your LRUCache object will be instantiated and called as such:
        # obj = LRUCache(capacity)
        # param_1 = obj.get(key)
        # obj.put(key,value)
        ''', ['''
        obj = LRUCache(2)
        obj.put(1, 1)
        obj.put(2, 2)
        assert obj.get(1) == 1
        obj.put(3, 3)
        assert obj.get(2) == -1
        obj.put(4, 4)
        assert obj.get(1) == -1
        assert obj.get(3) == 3
        assert obj.get(4) == 4
        '''], prelude=LC_PLAIN, entry="LRUCache"),
    lc("MinStack-design", '''
        class MinStack:

            def __init__(self):
                self.stk1 = []
                self.stk2 = [inf]

            def push(self, val: int) -> None:
                self.stk1.append(val)
                self.stk2.append(min(val, self.stk2[-1]))

            def pop(self) -> None:
                self.stk1.pop()
                self.stk2.pop()

            def top(self) -> int:
                return self.stk1[-1]

            def getMin(self) -> int:
                return self.stk2[-1]
        ''', ['''
        minStack = MinStack()
        minStack.push(-2)
        minStack.push(0)
        minStack.push(-3)
        assert minStack.getMin() == -3
        minStack.pop()
        assert minStack.top() == 0
        assert minStack.getMin() == -2
        '''], entry="MinStack"),
    lc("KthLargest-design-heap", '''
        class KthLargest:

            def __init__(self, k: int, nums: List[int]):
                self.k = k
                self.q = []
                for x in nums:
                    self.add(x)

            def add(self, val: int) -> int:
                heappush(self.q, val)
                if len(self.q) > self.k:
                    heappop(self.q)
                return self.q[0]
        ''', ['''
        kthLargest = KthLargest(3, [4, 5, 8, 2])
        assert [kthLargest.add(x) for x in (3, 5, 10, 9, 4)] == [4, 5, 5, 8, 8]
        '''], entry="KthLargest"),
    lc("Codec-serialize-tree", '''
        # Definition for a binary tree node.
        # class TreeNode(object):
        #     def __init__(self, x):
        #         self.val = x
        #         self.left = None
        #         self.right = None

        class Codec:

            def serialize(self, root):
                """Encodes a tree to a single string.

                :type root: TreeNode
                :rtype: str
                """
                out = []

                def dfs(node):
                    if node is None:
                        out.append("#")
                        return
                    out.append(str(node.val))
                    dfs(node.left)
                    dfs(node.right)

                dfs(root)
                return ",".join(out)

            def deserialize(self, data):
                """Decodes your encoded data to tree.

                :type data: str
                :rtype: TreeNode
                """
                vals = iter(data.split(","))

                def build():
                    v = next(vals)
                    if v == "#":
                        return None
                    node = TreeNode(int(v))
                    node.left = build()
                    node.right = build()
                    return node

                return build()

        # Your Codec object will be instantiated and called as such:
        # ser = Codec()
        # deser = Codec()
        # ans = deser.deserialize(ser.serialize(root))
        ''', ['''
        root = tree_node([1,2,3,None,None,4,5])
        ser = Codec()
        deser = Codec()
        ans = deser.deserialize(ser.serialize(root))
        assert is_same_tree(ans, root) and ans is not root
        assert ser.serialize(None) == "#" and deser.deserialize("#") is None
        '''], entry="Codec"),
    lc("redefines-ListNode-in-the-solution", '''
        from typing import Optional


        class ListNode:
            def __init__(self, val=0, next=None):
                self.val = val
                self.next = next


        class Solution:
            def middleNode(self, head: Optional[ListNode]) -> Optional[ListNode]:
                slow = fast = head
                while fast and fast.next:
                    slow = slow.next
                    fast = fast.next.next
                return slow
        ''', ['''
        head = build_list([1, 2, 3, 4, 5])
        mid = Solution().middleNode(head)
        assert mid is head.next.next and list_values(mid) == [3, 4, 5]
        ''', '''
        assert list_values(Solution().middleNode(build_list([1, 2, 3, 4, 5, 6]))) == [4, 5, 6]
        '''], prelude=LC_PLAIN),
    lc_check("flatten-tree-in-place", '''
        class Solution:
            def flatten(self, root: Optional[TreeNode]) -> None:
                """
                Do not return anything, modify root in-place instead.
                """
                while root:
                    if root.left:
                        pre = root.left
                        while pre.right:
                            pre = pre.right
                        pre.right = root.right
                        root.right = root.left
                        root.left = None
                    root = root.right
        ''', '''
        def check(candidate):
            root = tree_node([1,2,5,3,4,None,6])
            assert candidate(root = root) == None
            assert is_same_tree(root, tree_node([1,None,2,None,3,None,4,None,5,None,6]))
            assert candidate(root = tree_node([])) == None
        ''', "flatten"),
    lc("copyRandomList-node-identity", '''
        """
        # Definition for a Node.
        class Node:
            def __init__(self, x: int, next: 'Node' = None, random: 'Node' = None):
                self.val = int(x)
                self.next = next
                self.random = random
        """

        class Solution:
            def copyRandomList(self, head: 'Optional[Node]') -> 'Optional[Node]':
                d = {}
                cur = head
                while cur:
                    d[cur] = Node(cur.val)
                    cur = cur.next
                cur = head
                while cur:
                    d[cur].next = d.get(cur.next)
                    d[cur].random = d.get(cur.random)
                    cur = cur.next
                return d.get(head)
        ''', ['''
        nodes = [Node(v) for v in (7, 13, 11, 10, 1)]
        for a, b in zip(nodes, nodes[1:]):
            a.next = b
        for node, r in zip(nodes, (None, 0, 4, 2, 0)):
            node.random = None if r is None else nodes[r]
        copy = Solution().copyRandomList(nodes[0])
        seen = []
        cur = copy
        while cur:
            assert all(cur is not n for n in nodes)
            seen.append((cur.val, None if cur.random is None else cur.random.val))
            cur = cur.next
        assert seen == [(7, None), (13, 7), (11, 1), (10, 11), (1, 7)]
        assert copy.next.random is copy
        ''', '''
        assert Solution().copyRandomList(None) is None
        '''], prelude=LC_PLAIN + src('''


            class Node:
                def __init__(self, x: int, next: 'Node' = None, random: 'Node' = None):
                    self.val = int(x)
                    self.next = next
                    self.random = random
        ''')),
    lc("generateTrees-list-of-trees", '''
        class Solution:
            def generateTrees(self, n: int) -> List[Optional[TreeNode]]:
                def dfs(i: int, j: int) -> List[Optional[TreeNode]]:
                    if i > j:
                        return [None]
                    ans = []
                    for v in range(i, j + 1):
                        left = dfs(i, v - 1)
                        right = dfs(v + 1, j)
                        for l in left:
                            for r in right:
                                ans.append(TreeNode(v, l, r))
                    return ans

                return dfs(1, n)
        ''', ['''
        def preorder(node):
            return [] if node is None else [node.val] + preorder(node.left) + preorder(node.right)

        def inorder(node):
            return [] if node is None else inorder(node.left) + [node.val] + inorder(node.right)

        trees = Solution().generateTrees(3)
        assert len(trees) == 5
        assert all(inorder(t) == [1, 2, 3] for t in trees)
        assert sorted(preorder(t) for t in trees) == [[1, 2, 3], [1, 3, 2], [2, 1, 3], [3, 1, 2], [3, 2, 1]]
        ''', '''
        assert [t.val for t in Solution().generateTrees(1)] == [1]
        '''], prelude=LC_PLAIN),
    lc("Trie-design", '''
        class Trie:
            def __init__(self):
                self.children = {}
                self.is_end = False

            def insert(self, word: str) -> None:
                node = self
                for c in word:
                    node = node.children.setdefault(c, Trie())
                node.is_end = True

            def _find(self, prefix: str):
                node = self
                for c in prefix:
                    node = node.children.get(c)
                    if node is None:
                        return None
                return node

            def search(self, word: str) -> bool:
                node = self._find(word)
                return node is not None and node.is_end

            def startsWith(self, prefix: str) -> bool:
                return self._find(prefix) is not None


        # Your Trie object will be instantiated and called as such:
        # obj = Trie()
        # obj.insert(word)
        # param_2 = obj.search(word)
        # param_3 = obj.startsWith(prefix)
        ''', ['''
        trie = Trie()
        trie.insert("apple")
        assert trie.search("apple") == True
        assert trie.search("app") == False
        assert trie.startsWith("app") == True
        trie.insert("app")
        assert trie.search("app") == True
        '''], entry="Trie"),
]


# ================================================================ 4. BigCodeBench

RUN_MAIN = "\nif __name__ == '__main__':\n    unittest.main(exit=False)\n"
RUN_RUNNER = ("\nsuite = unittest.TestLoader().loadTestsFromTestCase(TestCases)\n"
              "result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=2).run(suite)\n"
              "assert result.wasSuccessful(), result.failures + result.errors\n")


def bcb(name, code, test, *, run=RUN_MAIN):
    """A BigCodeBench task: ``task_func`` and a ``TestCases`` class, run as the test's own code runs it."""
    test = src(test)
    if run is RUN_RUNNER and "import io" not in test:
        test = "import io\n" + test
    return task("bigcodebench", name, src(code), [test + run], entry="task_func")


BIGCODEBENCH = [
    bcb("json-counter-assertRaises", '''
        import json
        from collections import Counter


        def task_func(json_str, key):
            """
            Count how often each value of `key` occurs across a JSON array of records.

            Parameters:
            json_str (str): A JSON array of objects.
            key (str): The field to count.

            Returns:
            Counter: value -> number of records holding it.

            Raises:
            ValueError: If the JSON is not an array.

            Requirements:
            - json
            - collections
            """
            records = json.loads(json_str)
            if not isinstance(records, list):
                raise ValueError("Expected a JSON array of objects")
            return Counter(record[key] for record in records if key in record)
        ''', '''
        import unittest
        import json
        from collections import Counter


        class TestCases(unittest.TestCase):
            def test_basic_counts(self):
                data = json.dumps([{"city": "Paris"}, {"city": "Rome"}, {"city": "Paris"}])
                result = task_func(data, "city")
                self.assertIsInstance(result, Counter)
                self.assertEqual(result, Counter({"Paris": 2, "Rome": 1}))
                self.assertEqual(result.most_common(1), [("Paris", 2)])

            def test_missing_key_is_skipped(self):
                data = json.dumps([{"city": "Oslo"}, {"name": "x"}])
                self.assertEqual(dict(task_func(data, "city")), {"Oslo": 1})

            def test_empty_array(self):
                self.assertEqual(task_func("[]", "city"), Counter())

            def test_invalid_json(self):
                with self.assertRaises(json.JSONDecodeError):
                    task_func("{not json", "city")

            def test_not_an_array(self):
                self.assertRaises(ValueError, task_func, '{"city": "Paris"}', "city")
        '''),
    bcb("csv-files-setUp-tearDown", '''
        import csv
        import os


        def task_func(file_path, column):
            """
            Compute the average of a numeric column of a CSV file, skipping empty cells.

            Raises:
            FileNotFoundError: If the file does not exist.
            KeyError: If the column is not in the header.
            """
            if not os.path.exists(file_path):
                raise FileNotFoundError(f"No such file: '{file_path}'")
            with open(file_path, newline="") as f:
                reader = csv.DictReader(f)
                if column not in (reader.fieldnames or []):
                    raise KeyError(column)
                values = [float(row[column]) for row in reader if row[column].strip()]
            return sum(values) / len(values) if values else 0.0
        ''', '''
        import unittest
        import os
        import csv
        import shutil
        import tempfile


        class TestCases(unittest.TestCase):
            def setUp(self):
                self.test_dir = tempfile.mkdtemp()
                self.file_path = os.path.join(self.test_dir, "data.csv")
                with open(self.file_path, "w", newline="") as f:
                    writer = csv.writer(f)
                    writer.writerow(["name", "score", "age"])
                    writer.writerow(["a", "1.5", "20"])
                    writer.writerow(["b", "", "30"])
                    writer.writerow(["c", "2.5", "40"])

            def tearDown(self):
                shutil.rmtree(self.test_dir)

            def test_average_skips_empty(self):
                self.assertAlmostEqual(task_func(self.file_path, "score"), 2.0)

            def test_other_column(self):
                self.assertAlmostEqual(task_func(self.file_path, "age"), 30.0, places=5)

            def test_missing_file(self):
                with self.assertRaises(FileNotFoundError):
                    task_func(os.path.join(self.test_dir, "nope.csv"), "score")

            def test_missing_column(self):
                with self.assertRaises(KeyError):
                    task_func(self.file_path, "height")

            def test_header_only(self):
                path = os.path.join(self.test_dir, "empty.csv")
                with open(path, "w") as f:
                    f.write("name,score\\n")
                self.assertEqual(task_func(path, "score"), 0.0)
        '''),
    bcb("re-emails-subTest", '''
        import re


        def task_func(text):
            """
            Extract the unique e-mail addresses of a text, lower-cased and sorted.

            Requirements:
            - re
            """
            pattern = r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}"
            return sorted({m.lower() for m in re.findall(pattern, text)})
        ''', '''
        import unittest


        class TestCases(unittest.TestCase):
            def test_cases(self):
                cases = [
                    ("Contact: alice@example.com, Bob@Example.com", ["alice@example.com", "bob@example.com"]),
                    ("no addresses here", []),
                    ("dup x@y.org and X@Y.org", ["x@y.org"]),
                    ("first.last+tag@sub.domain.co.uk;", ["first.last+tag@sub.domain.co.uk"]),
                ]
                for text, expected in cases:
                    with self.subTest(text=text):
                        self.assertListEqual(task_func(text), expected)

            def test_return_type(self):
                self.assertIsInstance(task_func("a@b.cc"), list)
        ''', run=RUN_RUNNER),
    bcb("datetime-time-patched-decorator", '''
        import time
        from datetime import datetime, timedelta, timezone


        def task_func(hours_ago=0):
            """
            Return the UTC timestamp `hours_ago` hours before now, formatted as '%Y-%m-%d %H:%M:%S'.

            Requirements:
            - time
            - datetime
            """
            if hours_ago < 0:
                raise ValueError("hours_ago must be non-negative")
            now = datetime.fromtimestamp(time.time(), tz=timezone.utc)
            return (now - timedelta(hours=hours_ago)).strftime("%Y-%m-%d %H:%M:%S")
        ''', '''
        import unittest
        from unittest.mock import patch


        class TestCases(unittest.TestCase):
            @patch("time.time", return_value=1700000000.0)
            def test_now(self, mock_time):
                self.assertEqual(task_func(), "2023-11-14 22:13:20")
                mock_time.assert_called_once()

            @patch("time.time", return_value=1700000000.0)
            def test_hours_ago(self, mock_time):
                self.assertEqual(task_func(24), "2023-11-13 22:13:20")

            def test_negative(self):
                with self.assertRaises(ValueError):
                    task_func(-1)

            def test_format(self):
                with patch("time.time") as mock_time:
                    mock_time.return_value = 0
                    self.assertEqual(task_func(), "1970-01-01 00:00:00")
        '''),
    bcb("datetime-aware-values", '''
        from datetime import datetime, timezone


        def task_func(timestamps, fmt="%Y-%m-%dT%H:%M:%S%z"):
            """
            Parse timestamps with UTC offsets, convert them to UTC, and return them sorted
            together with the span between the first and the last.

            Returns:
            tuple: (list of aware datetimes in UTC, timedelta)
            """
            parsed = sorted(datetime.strptime(t, fmt).astimezone(timezone.utc) for t in timestamps)
            if not parsed:
                raise ValueError("no timestamps")
            return parsed, parsed[-1] - parsed[0]
        ''', '''
        import unittest
        from datetime import datetime, timedelta, timezone


        class TestCases(unittest.TestCase):
            def test_conversion(self):
                result, span = task_func(["2024-03-01T10:00:00+0200", "2024-03-01T07:30:00+0000"])
                self.assertEqual(result, [datetime(2024, 3, 1, 7, 30, tzinfo=timezone.utc),
                                          datetime(2024, 3, 1, 8, 0, tzinfo=timezone.utc)])
                self.assertEqual(span, timedelta(minutes=30))
                self.assertEqual(result[0].tzinfo, timezone.utc)

            def test_single(self):
                result, span = task_func(["2020-01-01T00:00:00-0530"])
                self.assertEqual(result[0].hour, 5)
                self.assertEqual(span.total_seconds(), 0)

            def test_empty(self):
                with self.assertRaises(ValueError):
                    task_func([])
        '''),
    bcb("itertools-combinations-subTest", '''
        import itertools


        def task_func(numbers, target):
            """
            Find every pair of numbers (by position) whose sum equals target.

            Returns:
            list of tuple: The pairs, in the order itertools.combinations produces them.
            """
            return [pair for pair in itertools.combinations(numbers, 2) if sum(pair) == target]
        ''', '''
        import unittest


        class TestCases(unittest.TestCase):
            def test_pairs(self):
                for numbers, target, expected in [
                    ([1, 2, 3, 4, 5], 5, [(1, 4), (2, 3)]),
                    ([0, 0, 0], 0, [(0, 0), (0, 0), (0, 0)]),
                    ([], 3, []),
                    ([-1, 4, 2], 3, [(-1, 4)]),
                ]:
                    with self.subTest(numbers=numbers, target=target):
                        self.assertEqual(task_func(numbers, target), expected)

            def test_floats(self):
                result = task_func([0.1, 0.2, 0.25], 0.35)
                self.assertEqual(len(result), 1)
                self.assertAlmostEqual(sum(result[0]), 0.35)
        '''),
    bcb("os-walk-tempdir-extensions", '''
        import os
        from collections import defaultdict


        def task_func(directory):
            """
            Count the files under a directory (recursively) by extension.

            Returns:
            dict: extension (lower-case, without the dot; '' when none) -> count.

            Raises:
            NotADirectoryError: If `directory` is not a directory.
            """
            if not os.path.isdir(directory):
                raise NotADirectoryError(directory)
            counts = defaultdict(int)
            for root, _dirs, files in os.walk(directory):
                for name in files:
                    ext = os.path.splitext(name)[1].lower().lstrip(".")
                    counts[ext] += 1
            return dict(counts)
        ''', '''
        import unittest
        import os
        import tempfile


        class TestCases(unittest.TestCase):
            def setUp(self):
                self.temp = tempfile.TemporaryDirectory()
                self.root = self.temp.name
                os.makedirs(os.path.join(self.root, "sub", "deeper"))
                for rel in ["a.txt", "b.TXT", "c.py", "sub/d.py", "sub/deeper/e.csv", "sub/README"]:
                    with open(os.path.join(self.root, rel), "w") as f:
                        f.write("x")

            def tearDown(self):
                self.temp.cleanup()

            def test_counts(self):
                self.assertDictEqual(task_func(self.root), {"txt": 2, "py": 2, "csv": 1, "": 1})

            def test_empty_dir(self):
                empty = os.path.join(self.root, "empty")
                os.mkdir(empty)
                self.assertEqual(task_func(empty), {})

            def test_not_a_directory(self):
                with self.assertRaises(NotADirectoryError):
                    task_func(os.path.join(self.root, "a.txt"))
        '''),
    bcb("io-stringio-csv-roundtrip", '''
        import csv
        import io
        from collections import OrderedDict


        def task_func(csv_text):
            """
            Sum the 'amount' column per 'category' of CSV text and return a CSV string
            with header 'category,total', categories in first-seen order.
            """
            totals = OrderedDict()
            for row in csv.DictReader(io.StringIO(csv_text)):
                totals[row["category"]] = totals.get(row["category"], 0) + int(row["amount"])
            out = io.StringIO()
            writer = csv.writer(out, lineterminator="\\n")
            writer.writerow(["category", "total"])
            for category, total in totals.items():
                writer.writerow([category, total])
            return out.getvalue()
        ''', '''
        import unittest
        import csv
        import io


        class TestCases(unittest.TestCase):
            def test_totals(self):
                text = "category,amount\\nfood,3\\nrent,10\\nfood,4\\n"
                self.assertEqual(task_func(text), "category,total\\nfood,7\\nrent,10\\n")

            def test_parse_back(self):
                rows = list(csv.reader(io.StringIO(task_func("category,amount\\nx,1\\n"))))
                self.assertEqual(rows, [["category", "total"], ["x", "1"]])

            def test_header_only(self):
                self.assertEqual(task_func("category,amount\\n"), "category,total\\n")

            def test_bad_amount(self):
                with self.assertRaises(ValueError):
                    task_func("category,amount\\nfood,abc\\n")
        ''', run="\nunittest.main(argv=[''], verbosity=2, exit=False)\n"),
    bcb("random-seeds-local-and-global", '''
        import random


        def task_func(num_rolls, seed=None):
            """
            Simulate rolling a six-sided die `num_rolls` times and return the rolls and their frequencies.

            Returns:
            tuple: (list of rolls, list of 6 frequencies)
            """
            if seed is not None:
                random.seed(seed)
            rolls = [random.randint(1, 6) for _ in range(num_rolls)]
            frequencies = [rolls.count(face) for face in range(1, 7)]
            return rolls, frequencies
        ''', '''
        import unittest
        import random


        class TestCases(unittest.TestCase):
            def test_reproducible_with_seed(self):
                self.assertEqual(task_func(50, seed=42), task_func(50, seed=42))

            def test_matches_the_generator(self):
                random.seed(7)
                expected = [random.randint(1, 6) for _ in range(20)]
                rolls, freq = task_func(20, seed=7)
                self.assertEqual(rolls, expected)
                self.assertEqual(sum(freq), 20)

            def test_global_seed(self):
                random.seed(0)
                first = task_func(10)
                random.seed(0)
                second = task_func(10)
                self.assertEqual(first, second)

            def test_range(self):
                rolls, freq = task_func(200, seed=1)
                self.assertTrue(all(1 <= r <= 6 for r in rolls))
                self.assertEqual(len(freq), 6)

            def test_zero(self):
                self.assertEqual(task_func(0, seed=3), ([], [0] * 6))
        ''', run="\nunittest.main()\n"),
    bcb("hashlib-file-digest", '''
        import hashlib
        import os


        def task_func(file_path, algorithm="sha256", chunk_size=4096):
            """
            Compute the hex digest of a file, reading it in chunks.

            Raises:
            FileNotFoundError: If the file does not exist.
            ValueError: If the algorithm is not available.
            """
            if algorithm not in hashlib.algorithms_available:
                raise ValueError(f"Unsupported algorithm: {algorithm}")
            if not os.path.isfile(file_path):
                raise FileNotFoundError(file_path)
            h = hashlib.new(algorithm)
            with open(file_path, "rb") as f:
                for chunk in iter(lambda: f.read(chunk_size), b""):
                    h.update(chunk)
            return h.hexdigest()
        ''', '''
        import unittest
        import hashlib
        import os
        import tempfile


        class TestCases(unittest.TestCase):
            def setUp(self):
                fd, self.path = tempfile.mkstemp(suffix=".bin")
                self.data = bytes(range(256)) * 100
                with os.fdopen(fd, "wb") as f:
                    f.write(self.data)

            def tearDown(self):
                if os.path.exists(self.path):
                    os.remove(self.path)

            def test_sha256(self):
                self.assertEqual(task_func(self.path), hashlib.sha256(self.data).hexdigest())

            def test_md5_small_chunks(self):
                self.assertEqual(task_func(self.path, "md5", chunk_size=7), hashlib.md5(self.data).hexdigest())

            def test_missing(self):
                os.remove(self.path)
                with self.assertRaises(FileNotFoundError):
                    task_func(self.path)

            def test_bad_algorithm(self):
                with self.assertRaisesRegex(ValueError, "Unsupported"):
                    task_func(self.path, "nope")
        '''),
    bcb("base64-hmac-json", '''
        import base64
        import hashlib
        import hmac
        import json


        def task_func(data, secret_key):
            """
            Serialize a dict to JSON (sorted keys), base64-encode it, and sign the encoded payload
            with HMAC-SHA256.

            Returns:
            dict: {'payload': str, 'signature': str}
            """
            payload = base64.b64encode(json.dumps(data, sort_keys=True).encode("utf-8")).decode("ascii")
            signature = hmac.new(secret_key.encode(), payload.encode(), hashlib.sha256).hexdigest()
            return {"payload": payload, "signature": signature}
        ''', '''
        import unittest
        import base64
        import hashlib
        import hmac
        import json


        class TestCases(unittest.TestCase):
            def test_payload_round_trip(self):
                data = {"b": [1, 2], "a": "x"}
                result = task_func(data, "k")
                self.assertEqual(json.loads(base64.b64decode(result["payload"])), data)

            def test_signature(self):
                result = task_func({"n": 1}, "secret")
                expected = hmac.new(b"secret", result["payload"].encode(), hashlib.sha256).hexdigest()
                self.assertTrue(hmac.compare_digest(result["signature"], expected))
                self.assertEqual(len(result["signature"]), 64)

            def test_unicode(self):
                result = task_func({"name": "Zo\\u00eb"}, "k")
                self.assertIn("Zo\\\\u00eb", base64.b64decode(result["payload"]).decode())
        '''),
    bcb("statistics-assertAlmostEqual", '''
        import statistics


        def task_func(values):
            """
            Summary statistics of a list of numbers.

            Returns:
            dict: 'mean', 'median', 'stdev' (sample; 0.0 for one value), 'mode'.

            Raises:
            ValueError: If the list is empty.
            """
            if not values:
                raise ValueError("values must not be empty")
            return {
                "mean": statistics.mean(values),
                "median": statistics.median(values),
                "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
                "mode": statistics.mode(values),
            }
        ''', '''
        import unittest
        import statistics


        class TestCases(unittest.TestCase):
            def test_basic(self):
                result = task_func([1, 2, 2, 3, 4])
                self.assertAlmostEqual(result["mean"], 2.4)
                self.assertEqual(result["median"], 2)
                self.assertAlmostEqual(result["stdev"], 1.140175425, places=6)
                self.assertEqual(result["mode"], 2)

            def test_floats(self):
                result = task_func([0.1, 0.2, 0.3])
                self.assertAlmostEqual(result["mean"], 0.2)
                self.assertAlmostEqual(result["stdev"], statistics.stdev([0.1, 0.2, 0.3]))

            def test_single(self):
                self.assertEqual(task_func([5])["stdev"], 0.0)

            def test_empty(self):
                with self.assertRaises(ValueError) as ctx:
                    task_func([])
                self.assertIn("empty", str(ctx.exception))
        '''),
    bcb("string-password-seeded", '''
        import random
        import string


        def task_func(length=12, seed=None):
            """
            Generate a password with at least one lower-case letter, one upper-case letter,
            one digit and one punctuation character.

            Raises:
            ValueError: If length < 4.
            """
            if length < 4:
                raise ValueError("length must be at least 4")
            rng = random.Random(seed)
            pools = [string.ascii_lowercase, string.ascii_uppercase, string.digits, string.punctuation]
            chars = [rng.choice(pool) for pool in pools]
            everything = "".join(pools)
            chars += [rng.choice(everything) for _ in range(length - len(chars))]
            rng.shuffle(chars)
            return "".join(chars)
        ''', '''
        import unittest
        import string


        class TestCases(unittest.TestCase):
            def test_length_and_classes(self):
                for length in (4, 12, 40):
                    with self.subTest(length=length):
                        pw = task_func(length, seed=length)
                        self.assertEqual(len(pw), length)
                        self.assertTrue(any(c in string.ascii_lowercase for c in pw))
                        self.assertTrue(any(c in string.ascii_uppercase for c in pw))
                        self.assertTrue(any(c in string.digits for c in pw))
                        self.assertTrue(any(c in string.punctuation for c in pw))

            def test_seeded(self):
                self.assertEqual(task_func(16, seed=99), task_func(16, seed=99))
                self.assertNotEqual(task_func(16, seed=1), task_func(16, seed=2))

            def test_too_short(self):
                self.assertRaises(ValueError, task_func, 3)
        '''),
    bcb("mock_open-builtins-open-decorator", '''
        def task_func(config_path):
            """
            Parse a simple 'key = value' configuration file, ignoring blank lines and '#' comments.

            Returns:
            dict: key -> value (both stripped).
            """
            config = {}
            with open(config_path, "r") as f:
                for line in f:
                    line = line.strip()
                    if not line or line.startswith("#"):
                        continue
                    key, _, value = line.partition("=")
                    config[key.strip()] = value.strip()
            return config
        ''', '''
        import unittest
        from unittest.mock import patch, mock_open


        class TestCases(unittest.TestCase):
            @patch("builtins.open", new_callable=mock_open, read_data="# comment\\nhost = localhost\\n\\nport=8080\\n")
            def test_parse(self, mock_file):
                result = task_func("app.conf")
                self.assertEqual(result, {"host": "localhost", "port": "8080"})
                mock_file.assert_called_once_with("app.conf", "r")

            def test_empty_file(self):
                with patch("builtins.open", mock_open(read_data="")) as mock_file:
                    self.assertEqual(task_func("empty.conf"), {})
                    mock_file.assert_called_once()

            @patch("builtins.open", side_effect=FileNotFoundError)
            def test_missing(self, mock_file):
                with self.assertRaises(FileNotFoundError):
                    task_func("missing.conf")
        '''),
    bcb("print-and-stdout-patched", '''
        def task_func(items):
            """
            Print one line per (name, qty) item and a final total line; return the total.
            """
            total = 0
            for name, qty in items:
                print(f"{name}: {qty}")
                total += qty
            print(f"Total: {total}")
            return total
        ''', '''
        import unittest
        import io
        from unittest.mock import patch, call


        class TestCases(unittest.TestCase):
            def test_print_calls(self):
                with patch("builtins.print") as mock_print:
                    total = task_func([("apple", 2), ("pear", 4)])
                self.assertEqual(total, 6)
                mock_print.assert_has_calls([call("apple: 2"), call("pear: 4"), call("Total: 6")])
                self.assertEqual(mock_print.call_count, 3)

            @patch("sys.stdout", new_callable=io.StringIO)
            def test_stdout(self, mock_stdout):
                task_func([("x", 1)])
                self.assertEqual(mock_stdout.getvalue(), "x: 1\\nTotal: 1\\n")

            def test_empty(self):
                with patch("builtins.print") as mock_print:
                    self.assertEqual(task_func([]), 0)
                mock_print.assert_called_once_with("Total: 0")
        '''),
    bcb("os-path-patched", '''
        import os


        def task_func(directory, extension=".txt"):
            """
            List the files of `directory` with the given extension, sorted.

            Raises:
            FileNotFoundError: If the directory does not exist.
            """
            if not os.path.exists(directory):
                raise FileNotFoundError(f"Directory '{directory}' not found.")
            return sorted(
                name for name in os.listdir(directory)
                if name.endswith(extension) and os.path.isfile(os.path.join(directory, name))
            )
        ''', '''
        import unittest
        from unittest.mock import patch


        class TestCases(unittest.TestCase):
            @patch("os.path.exists", return_value=False)
            def test_missing_directory(self, mock_exists):
                with self.assertRaises(FileNotFoundError):
                    task_func("/nonexistent")
                mock_exists.assert_called_once_with("/nonexistent")

            @patch("os.path.isfile", return_value=True)
            @patch("os.listdir", return_value=["b.txt", "a.txt", "c.csv"])
            @patch("os.path.exists", return_value=True)
            def test_lists_matching(self, mock_exists, mock_listdir, mock_isfile):
                self.assertEqual(task_func("/data"), ["a.txt", "b.txt"])
                mock_listdir.assert_called_once_with("/data")

            @patch("os.path.isfile", side_effect=lambda p: not p.endswith("dir.txt"))
            @patch("os.listdir", return_value=["dir.txt", "x.txt"])
            @patch("os.path.exists", return_value=True)
            def test_skips_directories(self, *mocks):
                self.assertEqual(task_func("/data"), ["x.txt"])
        '''),
    bcb("subprocess-run-patched", '''
        import subprocess
        import os


        def task_func(script_path, *args):
            """
            Run a shell script with arguments and return its exit code.

            Raises:
            ValueError: If the script does not exist.
            """
            if not os.path.isfile(script_path):
                raise ValueError(f"Script not found: {script_path}")
            completed = subprocess.run(["bash", script_path, *args], capture_output=True, text=True)
            return completed.returncode
        ''', '''
        import unittest
        import os
        import tempfile
        from unittest.mock import patch, MagicMock


        class TestCases(unittest.TestCase):
            def setUp(self):
                self.tmp = tempfile.TemporaryDirectory()
                self.script = os.path.join(self.tmp.name, "job.sh")
                with open(self.script, "w") as f:
                    f.write("#!/bin/bash\\nexit 0\\n")

            def tearDown(self):
                self.tmp.cleanup()

            @patch("subprocess.run")
            def test_success(self, mock_run):
                mock_run.return_value = MagicMock(returncode=0)
                self.assertEqual(task_func(self.script, "a", "b"), 0)
                mock_run.assert_called_once_with(["bash", self.script, "a", "b"], capture_output=True, text=True)

            @patch("subprocess.run")
            def test_failure_code(self, mock_run):
                mock_run.return_value.returncode = 3
                self.assertEqual(task_func(self.script), 3)

            def test_missing_script(self):
                with self.assertRaises(ValueError):
                    task_func(os.path.join(self.tmp.name, "missing.sh"))
        '''),
    bcb("shutil-glob-organize", '''
        import glob
        import os
        import shutil


        def task_func(source_dir):
            """
            Move every file of `source_dir` into a sub-directory named after its extension
            (without the dot; 'no_extension' when it has none).

            Returns:
            dict: sub-directory -> sorted list of the file names moved there.
            """
            moved = {}
            for path in glob.glob(os.path.join(source_dir, "*")):
                if not os.path.isfile(path):
                    continue
                name = os.path.basename(path)
                ext = os.path.splitext(name)[1][1:] or "no_extension"
                target = os.path.join(source_dir, ext)
                os.makedirs(target, exist_ok=True)
                shutil.move(path, os.path.join(target, name))
                moved.setdefault(ext, []).append(name)
            return {k: sorted(v) for k, v in moved.items()}
        ''', '''
        import unittest
        import os
        import shutil
        import tempfile


        class TestCases(unittest.TestCase):
            def setUp(self):
                self.base = tempfile.mkdtemp()
                for name in ("a.txt", "b.txt", "c.log", "README"):
                    with open(os.path.join(self.base, name), "w") as f:
                        f.write(name)

            def tearDown(self):
                shutil.rmtree(self.base, ignore_errors=True)

            def test_moves(self):
                result = task_func(self.base)
                self.assertEqual(result, {"txt": ["a.txt", "b.txt"], "log": ["c.log"], "no_extension": ["README"]})
                self.assertTrue(os.path.isfile(os.path.join(self.base, "txt", "a.txt")))
                self.assertFalse(os.path.exists(os.path.join(self.base, "a.txt")))
                with open(os.path.join(self.base, "no_extension", "README")) as f:
                    self.assertEqual(f.read(), "README")

            def test_empty(self):
                empty = tempfile.mkdtemp(dir=self.base)
                self.assertEqual(task_func(empty), {})
        '''),
    bcb("zipfile-archive", '''
        import os
        import zipfile


        def task_func(directory, archive_name="archive.zip"):
            """
            Zip every .txt file of `directory` (not recursive) into `archive_name` inside it.

            Returns:
            str: The path of the archive, or None when there is nothing to archive.
            """
            files = sorted(f for f in os.listdir(directory) if f.endswith(".txt"))
            if not files:
                return None
            archive_path = os.path.join(directory, archive_name)
            with zipfile.ZipFile(archive_path, "w", zipfile.ZIP_DEFLATED) as zf:
                for name in files:
                    zf.write(os.path.join(directory, name), arcname=name)
            return archive_path
        ''', '''
        import unittest
        import os
        import shutil
        import tempfile
        import zipfile


        class TestCases(unittest.TestCase):
            def setUp(self):
                self.dir = tempfile.mkdtemp()
                for name, text in (("one.txt", "1"), ("two.txt", "22"), ("skip.md", "#")):
                    with open(os.path.join(self.dir, name), "w") as f:
                        f.write(text)

            def tearDown(self):
                shutil.rmtree(self.dir)

            def test_archive(self):
                path = task_func(self.dir)
                self.assertEqual(path, os.path.join(self.dir, "archive.zip"))
                with zipfile.ZipFile(path) as zf:
                    self.assertEqual(sorted(zf.namelist()), ["one.txt", "two.txt"])
                    self.assertEqual(zf.read("two.txt"), b"22")

            def test_nothing(self):
                empty = os.path.join(self.dir, "empty")
                os.mkdir(empty)
                self.assertIsNone(task_func(empty))
        '''),
    bcb("relative-output-file-in-cwd", '''
        import json
        import os


        def task_func(records, output_file="output.json"):
            """
            Keep the records with a truthy 'active' field, write them to `output_file`
            (relative to the working directory) as JSON, and return the file's absolute path.
            """
            active = [r for r in records if r.get("active")]
            with open(output_file, "w") as f:
                json.dump(active, f, indent=2)
            return os.path.abspath(output_file)
        ''', '''
        import unittest
        import json
        import os


        class TestCases(unittest.TestCase):
            def tearDown(self):
                if os.path.exists("output.json"):
                    os.remove("output.json")

            def test_writes_file(self):
                path = task_func([{"id": 1, "active": True}, {"id": 2, "active": False}])
                self.assertTrue(os.path.exists("output.json"))
                self.assertEqual(path, os.path.abspath("output.json"))
                with open("output.json") as f:
                    self.assertEqual(json.load(f), [{"id": 1, "active": True}])

            def test_empty(self):
                task_func([])
                with open("output.json") as f:
                    self.assertEqual(json.load(f), [])
        '''),
    bcb("time-sleep-patched-retry", '''
        import time


        def task_func(operation, retries=3, delay=1.0):
            """
            Call `operation()` until it succeeds, at most `retries` times, sleeping `delay`
            seconds (doubling each time) between attempts.

            Returns:
            The operation's result.

            Raises:
            The last exception when every attempt failed.
            """
            last = None
            for attempt in range(retries):
                try:
                    return operation()
                except Exception as exc:
                    last = exc
                    if attempt < retries - 1:
                        time.sleep(delay * (2 ** attempt))
            raise last
        ''', '''
        import unittest
        from unittest.mock import patch, MagicMock, call


        class TestCases(unittest.TestCase):
            @patch("time.sleep")
            def test_succeeds_after_failures(self, mock_sleep):
                op = MagicMock(side_effect=[ConnectionError("down"), ConnectionError("down"), "ok"])
                self.assertEqual(task_func(op), "ok")
                self.assertEqual(op.call_count, 3)
                mock_sleep.assert_has_calls([call(1.0), call(2.0)])

            @patch("time.sleep")
            def test_gives_up(self, mock_sleep):
                op = MagicMock(side_effect=TimeoutError("slow"))
                with self.assertRaises(TimeoutError):
                    task_func(op, retries=2, delay=0.5)
                mock_sleep.assert_called_once_with(0.5)

            def test_first_try(self):
                self.assertEqual(task_func(lambda: 42), 42)
        '''),
    bcb("socket-patched-threads", '''
        import socket
        from ipaddress import IPv4Network
        from threading import Thread


        def task_func(ip_range, port):
            """
            Scan a specified IP address range and checks if a specified port is open on each IP.
            The function returns a dictionary with IP addresses as keys and a boolean indicating
            the port's status (True if open, False otherwise).

            Requirements:
            - socket
            - ipaddress.IPv4Network
            - threading.Thread
            """
            open_ports = {}

            def check_port(ip):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.settimeout(1)
                try:
                    sock.connect((str(ip), port))
                    open_ports[str(ip)] = True
                except socket.error:
                    open_ports[str(ip)] = False
                finally:
                    sock.close()

            threads = []

            for ip in IPv4Network(ip_range):
                thread = Thread(target=check_port, args=(ip,))
                thread.start()
                threads.append(thread)

            for thread in threads:
                thread.join()

            return open_ports
        ''', '''
        import unittest
        from unittest.mock import patch, MagicMock
        import socket
        from ipaddress import IPv4Network


        class TestCases(unittest.TestCase):
            @patch('socket.socket')
            def test_return_type(self, mock_socket):
                """Test that the function returns a dictionary."""
                mock_socket.return_value.connect = MagicMock()
                result = task_func('192.168.0.0/30', 80)
                self.assertIsInstance(result, dict)

            @patch('socket.socket')
            def test_open_port(self, mock_socket):
                """Test that an open port is correctly detected."""
                mock_socket.return_value.connect = MagicMock()
                result = task_func('192.168.0.0/30', 80)
                self.assertTrue(any(result.values()), "At least one port should be open for the test range.")

            @patch('socket.socket')
            def test_closed_port(self, mock_socket):
                """Test that a closed port is correctly detected."""
                mock_socket.return_value.connect.side_effect = socket.error
                result = task_func('192.168.0.0/30', 80)
                self.assertTrue(not any(result.values()), "All ports should be closed for the test range.")

            def test_all_ips_checked(self):
                """Test that all IPs in the range are checked."""
                ip_range = '192.168.0.0/30'
                port = 80
                result = task_func(ip_range, port)
                expected_ips = {str(ip) for ip in IPv4Network(ip_range)}
                self.assertEqual(set(result.keys()), expected_ips, "All IPs in the range should be checked.")

            @patch('socket.socket')
            def test_return_value_structure(self, mock_socket):
                """
                Test that the function returns a dictionary with string keys (IP addresses)
                and boolean values indicating the port status.
                """
                mock_socket.return_value.connect = MagicMock()
                result = task_func('192.168.0.0/30', 80)
                for ip, status in result.items():
                    self.assertIsInstance(ip, str, "All keys should be strings representing IP addresses.")
                    self.assertIsInstance(status, bool, "All values should be booleans indicating port status.")
        '''),
    bcb("os-environ-patch-dict", '''
        import os


        def task_func(app_name):
            """
            Build a mail configuration for an application from environment variables,
            with defaults for anything unset.

            Returns:
            dict: APP_NAME, MAIL_SERVER, MAIL_PORT (int), MAIL_USE_TLS (bool), MAIL_USERNAME.
            """
            return {
                "APP_NAME": app_name,
                "MAIL_SERVER": os.getenv("MAIL_SERVER", "localhost"),
                "MAIL_PORT": int(os.getenv("MAIL_PORT", 25)),
                "MAIL_USE_TLS": os.getenv("MAIL_USE_TLS", "False") == "True",
                "MAIL_USERNAME": os.getenv("MAIL_USERNAME", None),
            }
        ''', '''
        import unittest
        from unittest.mock import patch


        class TestCases(unittest.TestCase):
            def test_defaults(self):
                config = task_func("app")
                self.assertEqual(config["MAIL_SERVER"], "localhost")
                self.assertEqual(config["MAIL_PORT"], 25)
                self.assertFalse(config["MAIL_USE_TLS"])
                self.assertIsNone(config["MAIL_USERNAME"])

            @patch.dict('os.environ', {'MAIL_SERVER': 'test_server', 'MAIL_PORT': '2525', 'MAIL_USE_TLS': 'True',
                                       'MAIL_USERNAME': 'test'})
            def test_from_environment(self):
                config = task_func("test_case_2")
                self.assertEqual(config["MAIL_SERVER"], "test_server")
                self.assertEqual(config["MAIL_PORT"], 2525)
                self.assertTrue(config["MAIL_USE_TLS"])
                self.assertEqual(config["MAIL_USERNAME"], "test")
                self.assertEqual(config["APP_NAME"], "test_case_2")
        '''),
    bcb("logging-assertLogs", '''
        import logging


        def task_func(records):
            """
            Return the ids of the records that have one, logging a warning for each record without.
            """
            ids = []
            for record in records:
                if "id" not in record:
                    logging.warning("Skipping record without id: %s", record)
                    continue
                ids.append(record["id"])
            return ids
        ''', '''
        import unittest


        class TestCases(unittest.TestCase):
            def test_valid(self):
                self.assertEqual(task_func([{"id": 1}, {"id": 2}]), [1, 2])

            def test_warns_for_missing_id(self):
                with self.assertLogs(level="WARNING") as cm:
                    result = task_func([{"id": 1}, {"name": "x"}])
                self.assertEqual(result, [1])
                self.assertEqual(len(cm.output), 1)
                self.assertIn("Skipping record without id", cm.output[0])
        '''),
    bcb("pathlib-path-return", '''
        import json
        from pathlib import Path


        def task_func(data, output_dir, filename="data.json"):
            """
            Write `data` as indented JSON to `output_dir`/`filename`, creating the directory.

            Returns:
            Path: The path of the written file.
            """
            out = Path(output_dir)
            out.mkdir(parents=True, exist_ok=True)
            path = out / filename
            path.write_text(json.dumps(data, indent=2))
            return path
        ''', '''
        import unittest
        import json
        import os
        import shutil
        import tempfile
        from pathlib import Path


        class TestCases(unittest.TestCase):
            def setUp(self):
                self.test_dir = tempfile.mkdtemp()

            def tearDown(self):
                shutil.rmtree(self.test_dir)

            def test_writes(self):
                result = task_func({"a": 1}, self.test_dir)
                self.assertEqual(result, Path(self.test_dir) / "data.json")
                self.assertTrue(result.exists())
                self.assertEqual(json.loads(result.read_text()), {"a": 1})

            def test_creates_directory(self):
                target = os.path.join(self.test_dir, "nested", "dir")
                result = task_func([1, 2], target, "list.json")
                self.assertTrue(os.path.isfile(result))
                self.assertEqual(result.name, "list.json")
        '''),
    bcb("chdir-in-setUp", '''
        import csv
        import os


        def task_func(filename="report.csv"):
            """
            Summarise the .txt files of the current working directory into a CSV report
            (file name, number of lines), written to `filename` in the working directory.

            Returns:
            list of tuple: The (name, line count) rows, sorted by name.
            """
            rows = []
            for name in sorted(os.listdir(".")):
                if name.endswith(".txt"):
                    with open(name) as f:
                        rows.append((name, sum(1 for _ in f)))
            with open(filename, "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(["file", "lines"])
                writer.writerows(rows)
            return rows
        ''', '''
        import unittest
        import os
        import shutil
        import tempfile


        class TestCases(unittest.TestCase):
            def setUp(self):
                self.old_cwd = os.getcwd()
                self.test_dir = tempfile.mkdtemp()
                os.chdir(self.test_dir)
                with open("a.txt", "w") as f:
                    f.write("1\\n2\\n3\\n")
                with open("b.txt", "w") as f:
                    f.write("only\\n")

            def tearDown(self):
                os.chdir(self.old_cwd)
                shutil.rmtree(self.test_dir)

            def test_report(self):
                self.assertEqual(task_func(), [("a.txt", 3), ("b.txt", 1)])
                self.assertTrue(os.path.exists("report.csv"))
        '''),
    bcb("namedtemporaryfile-json", '''
        import json


        def task_func(file_path, key):
            """
            Load a JSON file holding a list of objects and return the sorted unique values of `key`.

            Raises:
            FileNotFoundError: If the file does not exist.
            """
            with open(file_path, "r", encoding="utf-8") as f:
                data = json.load(f)
            return sorted({item[key] for item in data if key in item})
        ''', '''
        import unittest
        import json
        import os
        import tempfile


        class TestCases(unittest.TestCase):
            def setUp(self):
                with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
                    json.dump([{"tag": "b"}, {"tag": "a"}, {"tag": "b"}, {"other": 1}], f)
                    self.path = f.name

            def tearDown(self):
                os.unlink(self.path)

            def test_values(self):
                self.assertEqual(task_func(self.path, "tag"), ["a", "b"])

            def test_missing_key(self):
                self.assertEqual(task_func(self.path, "nope"), [])

            def test_missing_file(self):
                with self.assertRaises(FileNotFoundError):
                    task_func(self.path + ".missing", "tag")
        '''),
    bcb("uuid-values", '''
        import uuid


        def task_func(names, namespace=uuid.NAMESPACE_DNS):
            """
            Give every name a deterministic UUID (version 5) in `namespace`.

            Returns:
            dict: name -> uuid.UUID
            """
            return {name: uuid.uuid5(namespace, name) for name in names}
        ''', '''
        import unittest
        import uuid


        class TestCases(unittest.TestCase):
            def test_deterministic(self):
                result = task_func(["example.com", "python.org"])
                self.assertEqual(result["example.com"], uuid.uuid5(uuid.NAMESPACE_DNS, "example.com"))
                self.assertIsInstance(result["python.org"], uuid.UUID)
                self.assertEqual(result["python.org"].version, 5)

            def test_namespace(self):
                result = task_func(["x"], uuid.NAMESPACE_URL)
                self.assertEqual(str(result["x"]), str(uuid.uuid5(uuid.NAMESPACE_URL, "x")))

            def test_empty(self):
                self.assertEqual(task_func([]), {})
        '''),
    bcb("sqlite3-database-file", '''
        import sqlite3


        def task_func(db_path, min_age):
            """
            Return the (name, age) rows of the `users` table of the SQLite database at `db_path`
            whose age is at least `min_age`, ordered by age then name.

            Raises:
            ValueError: If min_age is negative.
            """
            if min_age < 0:
                raise ValueError("min_age must be non-negative")
            conn = sqlite3.connect(db_path)
            try:
                cur = conn.execute(
                    "SELECT name, age FROM users WHERE age >= ? ORDER BY age, name", (min_age,)
                )
                return cur.fetchall()
            finally:
                conn.close()
        ''', '''
        import unittest
        import os
        import sqlite3
        import tempfile


        class TestCases(unittest.TestCase):
            def setUp(self):
                self.tmp = tempfile.TemporaryDirectory()
                self.db = os.path.join(self.tmp.name, "test.db")
                conn = sqlite3.connect(self.db)
                conn.execute("CREATE TABLE users (name TEXT, age INTEGER)")
                conn.executemany("INSERT INTO users VALUES (?, ?)", [("ann", 31), ("bob", 25), ("cid", 31), ("dee", 19)])
                conn.commit()
                conn.close()

            def tearDown(self):
                self.tmp.cleanup()

            def test_filter(self):
                self.assertEqual(task_func(self.db, 25), [("bob", 25), ("ann", 31), ("cid", 31)])

            def test_none(self):
                self.assertEqual(task_func(self.db, 99), [])

            def test_negative(self):
                with self.assertRaises(ValueError):
                    task_func(self.db, -1)
        '''),
    bcb("argparse-sys-argv-patch-object", '''
        import argparse
        import sys


        def task_func():
            """
            Parse the command line (--width, --height, optional --unit) and return the area
            as a string such as '12 m2'.
            """
            parser = argparse.ArgumentParser(description="Compute an area")
            parser.add_argument("--width", type=float, required=True)
            parser.add_argument("--height", type=float, required=True)
            parser.add_argument("--unit", default="m")
            args = parser.parse_args(sys.argv[1:])
            area = args.width * args.height
            return f"{area:g} {args.unit}2"
        ''', '''
        import unittest
        import sys
        import io
        from unittest.mock import patch


        class TestCases(unittest.TestCase):
            def test_area(self):
                with patch.object(sys, "argv", ["area.py", "--width", "3", "--height", "4"]):
                    self.assertEqual(task_func(), "12 m2")

            @patch("sys.argv", ["area.py", "--width", "2.5", "--height", "2", "--unit", "cm"])
            def test_unit(self):
                self.assertEqual(task_func(), "5 cm2")

            def test_missing_argument(self):
                with patch.object(sys, "argv", ["area.py", "--width", "3"]), patch("sys.stderr", new_callable=io.StringIO):
                    with self.assertRaises(SystemExit):
                        task_func()
        '''),
    bcb("warnings-assertWarns", '''
        import warnings


        def task_func(values, threshold=100):
            """
            Clip values to `threshold`, issuing a UserWarning when anything was clipped.
            """
            clipped = [min(v, threshold) for v in values]
            if clipped != list(values):
                warnings.warn(f"{sum(v > threshold for v in values)} value(s) clipped", UserWarning)
            return clipped
        ''', '''
        import unittest
        import warnings


        class TestCases(unittest.TestCase):
            def test_warns(self):
                with self.assertWarns(UserWarning) as cm:
                    result = task_func([50, 150, 300])
                self.assertEqual(result, [50, 100, 100])
                self.assertIn("2 value(s) clipped", str(cm.warning))

            def test_no_warning(self):
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    self.assertEqual(task_func([1, 2]), [1, 2])
        '''),
    bcb("input-side_effect", '''
        def task_func():
            """
            Read numbers from input() until the user types 'done'; ignore what is not a number.

            Returns:
            tuple: (count, total, average) of the numbers read (average 0.0 when none).
            """
            numbers = []
            while True:
                entry = input("Enter a number (or 'done'): ").strip()
                if entry.lower() == "done":
                    break
                try:
                    numbers.append(float(entry))
                except ValueError:
                    print(f"Invalid input: {entry}")
            total = sum(numbers)
            return len(numbers), total, (total / len(numbers) if numbers else 0.0)
        ''', '''
        import unittest
        from unittest.mock import patch


        class TestCases(unittest.TestCase):
            @patch("builtins.input", side_effect=["4", "x", "6.5", "done"])
            @patch("builtins.print")
            def test_numbers(self, mock_print, mock_input):
                count, total, average = task_func()
                self.assertEqual(count, 2)
                self.assertAlmostEqual(total, 10.5)
                self.assertAlmostEqual(average, 5.25)
                mock_print.assert_called_once_with("Invalid input: x")
                self.assertEqual(mock_input.call_count, 4)

            def test_none(self):
                with patch("builtins.input", return_value="DONE"):
                    self.assertEqual(task_func(), (0, 0, 0.0))
        '''),
    bcb("decimal-money", '''
        from decimal import Decimal, ROUND_HALF_UP


        def task_func(prices, tax_rate="0.2"):
            """
            Total the prices (strings) with tax, rounded half-up to cents.

            Returns:
            dict: 'subtotal', 'tax', 'total' as Decimal.
            """
            subtotal = sum((Decimal(p) for p in prices), Decimal("0"))
            tax = (subtotal * Decimal(tax_rate)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
            return {"subtotal": subtotal, "tax": tax, "total": subtotal + tax}
        ''', '''
        import unittest
        from decimal import Decimal


        class TestCases(unittest.TestCase):
            def test_totals(self):
                result = task_func(["19.99", "5.01"])
                self.assertEqual(result, {"subtotal": Decimal("25.00"), "tax": Decimal("5.00"), "total": Decimal("30.00")})

            def test_rounding(self):
                self.assertEqual(task_func(["0.125"], "0.1")["tax"], Decimal("0.01"))
                self.assertEqual(str(task_func(["1.05"], "0.5")["tax"]), "0.53")

            def test_empty(self):
                self.assertEqual(task_func([])["total"], 0)
        '''),
    bcb("statistics-nan-for-empty", '''
        import math
        import statistics


        def task_func(data, key):
            """
            Mean and population standard deviation of the `key` values of a list of dicts;
            (nan, nan) when no record has the key.
            """
            values = [d[key] for d in data if key in d]
            if not values:
                return float("nan"), float("nan")
            return statistics.fmean(values), statistics.pstdev(values)
        ''', '''
        import unittest
        import math


        class TestCases(unittest.TestCase):
            def test_values(self):
                mean, std = task_func([{"x": 1}, {"x": 3}, {"y": 10}], "x")
                self.assertAlmostEqual(mean, 2.0)
                self.assertAlmostEqual(std, 1.0)

            def test_empty(self):
                mean, std = task_func([{"y": 1}], "x")
                self.assertTrue(math.isnan(mean))
                self.assertTrue(math.isnan(std))
        '''),
    bcb("urlopen-patched-context-manager", '''
        import json
        import urllib.request


        def task_func(url, timeout=5):
            """
            Fetch a JSON document from `url` and return the names of its 'items', sorted.

            Raises:
            ValueError: If the document has no 'items' list.
            """
            with urllib.request.urlopen(url, timeout=timeout) as response:
                payload = json.loads(response.read().decode("utf-8"))
            items = payload.get("items")
            if not isinstance(items, list):
                raise ValueError("no items in the response")
            return sorted(item["name"] for item in items)
        ''', '''
        import unittest
        from unittest.mock import patch, MagicMock


        class TestCases(unittest.TestCase):
            @patch("urllib.request.urlopen")
            def test_items(self, mock_urlopen):
                mock_response = MagicMock()
                mock_response.read.return_value = b'{"items": [{"name": "b"}, {"name": "a"}]}'
                mock_urlopen.return_value.__enter__.return_value = mock_response
                self.assertEqual(task_func("http://example.com/api"), ["a", "b"])
                mock_urlopen.assert_called_once_with("http://example.com/api", timeout=5)

            @patch("urllib.request.urlopen")
            def test_no_items(self, mock_urlopen):
                mock_urlopen.return_value.__enter__.return_value.read.return_value = b'{"other": 1}'
                with self.assertRaises(ValueError):
                    task_func("http://example.com/api")
        '''),
    bcb("multiprocessing-pool-factorials", '''
        from multiprocessing import Pool
        import math


        def calculate_factorial(number: int) -> tuple:
            return number, math.factorial(number)


        def task_func(numbers: list) -> dict:
            """
            Calculate factorials for a list of numbers in parallel using multiprocessing.

            Raises:
            ValueError: If any element in the input list is not an integer or is negative.
            """
            if not all(isinstance(n, int) and n >= 0 for n in numbers):
                raise ValueError("All elements in the list must be integers")
            with Pool(2) as pool:
                factorial_dict = dict(pool.starmap(calculate_factorial, [(i,) for i in numbers]))
            return factorial_dict
        ''', '''
        import unittest
        import math


        class TestCases(unittest.TestCase):
            def test_return_type(self):
                result = task_func([3, 4, 5])
                self.assertIsInstance(result, dict)

            def test_empty_list(self):
                result = task_func([])
                self.assertEqual(result, {})

            def test_very_large_number(self):
                result = task_func([20])
                self.assertEqual(result[20], math.factorial(20))

            def test_invalid_input(self):
                with self.assertRaises(ValueError):
                    task_func([-1, 2])
        '''),
]


BATTERY = MBPP + HUMANEVAL + LEETCODE + BIGCODEBENCH


# ================================================================ the tests

async def scored(pool, registry, references, code, tests, *, setup="", entry="", trust="judge") -> Evaluation:
    spec = RewardSpec(tests=tests, setup=setup, entry_point=entry, trust=trust, timeout_s=10.0, reference=code)
    return await evaluate(pool, registry, spec, f"```python\n{code}```", f"battery/{uuid.uuid4().hex[:6]}",
                          references=references)


@pytest.fixture
def references(pool) -> ReferenceChecks:
    return ReferenceChecks(pool)


def test_the_battery_covers_four_styles() -> None:
    styles = [p.values[0] for p in BATTERY]
    assert all(styles.count(s) >= 16 for s in STYLES) and len(BATTERY) >= 64
    assert len({p.id for p in BATTERY}) == len(BATTERY)


@pytest.mark.parametrize("style, code, tests, setup, entry", BATTERY)
async def test_honest_task_scores_full(pool, registry, references, style, code, tests, setup, entry):
    control = await scored(pool, registry, None, code, tests, setup=setup, entry=entry, trust="in_process")
    assert control.scored.reward == 1.0, (control.scored.execution, control.result.events)  # the task is right
    evaluation = await scored(pool, registry, references, code, tests, setup=setup, entry=entry)
    record = evaluation.scored.execution
    failed = [e for e in evaluation.result.events if e.get("e") in ("test", "tamper") and not e.get("ok")]
    if not (evaluation.scored.reward == 1.0 and record.trust == "judge"):
        raise JudgeWrong(f"reward {evaluation.scored.reward}: {failed} {record}")
    if evaluation.reference is None or not evaluation.reference.judged:  # the judge honours the form
        raise JudgeWrong(f"reference check not judged: {evaluation.reference}")
