"""The polyglot suite's programs: for each problem of build.py and each language, a right program and
the one edit (old text, new text) that makes it the wrong one (each fails at least one visible test).

Plain data; build.py checks that every edit's old text occurs exactly once in its program.
"""

from __future__ import annotations

# problem -> language -> (right program, text to replace, its replacement in the wrong program)
PROGRAMS: dict[str, dict[str, tuple[str, str, str]]] = {}

PROGRAMS["reverse_words"] = {
    "c": (r'''#include <stdio.h>

static char words[10000][101];

int main(void) {
    int n = 0;
    while (n < 10000 && scanf("%100s", words[n]) == 1) n++;
    for (int i = n - 1; i >= 0; i--) printf("%s%s", words[i], i > 0 ? " " : "");
    printf("\n");
    return 0;
}
''', "i >= 0", "i > 0"),
    "cpp": (r'''#include <bits/stdc++.h>
using namespace std;

int main() {
    vector<string> words;
    string w;
    while (cin >> w) words.push_back(w);
    for (int i = (int)words.size() - 1; i >= 0; i--) cout << words[i] << (i > 0 ? " " : "");
    cout << "\n";
}
''', "i >= 0", "i > 0"),
    "java": (r'''public class Main {
    public static void main(String[] args) throws Exception {
        String[] words = new String(System.in.readAllBytes()).trim().split("\\s+");
        StringBuilder out = new StringBuilder();
        for (int i = words.length - 1; i >= 0; i--) out.append(words[i]).append(i > 0 ? " " : "");
        System.out.println(out);
    }
}
''', "i >= 0", "i > 0"),
    "javascript": (r'''const words = require('fs').readFileSync(0, 'utf8').trim().split(/\s+/);
const out = [];
for (let i = words.length - 1; i >= 0; i--) out.push(words[i]);
console.log(out.join(' '));
''', "i >= 0", "i > 0"),
    "go": (r'''package main

import (
    "bufio"
    "fmt"
    "os"
    "strings"
)

func main() {
    reader := bufio.NewReader(os.Stdin)
    var words []string
    for {
        var w string
        if _, err := fmt.Fscan(reader, &w); err != nil {
            break
        }
        words = append(words, w)
    }
    out := []string{}
    for i := len(words) - 1; i >= 0; i-- {
        out = append(out, words[i])
    }
    fmt.Println(strings.Join(out, " "))
}
''', "i >= 0", "i > 0"),
    "rust": (r'''use std::io::Read;

fn main() {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).unwrap();
    let words: Vec<&str> = s.split_whitespace().collect();
    let out: Vec<&str> = (0..words.len()).rev().map(|i| words[i]).collect();
    println!("{}", out.join(" "));
}
''', "(0..words.len())", "(1..words.len())"),
}

PROGRAMS["running_sum"] = {
    "c": (r'''#include <stdio.h>

int main(void) {
    int n;
    if (scanf("%d", &n) != 1) return 1;
    long long sum = 0;
    for (int i = 0; i < n; i++) {
        long long x;
        if (scanf("%lld", &x) != 1) return 1;
        sum += x;
        printf("%lld%s", sum, i + 1 < n ? " " : "");
    }
    printf("\n");
    return 0;
}
''', "i < n;", "i < n - 1;"),
    "cpp": (r'''#include <bits/stdc++.h>
using namespace std;

int main() {
    int n;
    cin >> n;
    long long sum = 0;
    for (int i = 0; i < n; i++) {
        long long x;
        cin >> x;
        sum += x;
        cout << sum << (i + 1 < n ? " " : "");
    }
    cout << "\n";
}
''', "i < n;", "i < n - 1;"),
    "java": (r'''public class Main {
    public static void main(String[] args) throws Exception {
        String[] t = new String(System.in.readAllBytes()).trim().split("\\s+");
        int n = Integer.parseInt(t[0]);
        long sum = 0;
        StringBuilder out = new StringBuilder();
        for (int i = 0; i < n; i++) {
            sum += Long.parseLong(t[i + 1]);
            if (i > 0) out.append(' ');
            out.append(sum);
        }
        System.out.println(out);
    }
}
''', "i < n;", "i < n - 1;"),
    "javascript": (r'''const t = require('fs').readFileSync(0, 'utf8').trim().split(/\s+/).map(Number);
const n = t[0];
const out = [];
let sum = 0;
for (let i = 0; i < n; i++) {
  sum += t[i + 1];
  out.push(sum);
}
console.log(out.join(' '));
''', "i < n;", "i < n - 1;"),
    "go": (r'''package main

import (
    "bufio"
    "fmt"
    "os"
    "strconv"
    "strings"
)

func main() {
    reader := bufio.NewReader(os.Stdin)
    var n int
    fmt.Fscan(reader, &n)
    var sum int64
    out := []string{}
    for i := 0; i < n; i++ {
        var x int64
        fmt.Fscan(reader, &x)
        sum += x
        out = append(out, strconv.FormatInt(sum, 10))
    }
    fmt.Println(strings.Join(out, " "))
}
''', "i < n;", "i < n-1;"),
    "rust": (r'''use std::io::Read;

fn main() {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).unwrap();
    let t: Vec<i64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
    let n = t[0] as usize;
    let mut sum = 0i64;
    let mut out = Vec::new();
    for i in 0..n {
        sum += t[i + 1];
        out.push(sum.to_string());
    }
    println!("{}", out.join(" "));
}
''', "0..n {", "1..n {"),
}

PROGRAMS["gcd_lcm"] = {
    "c": (r'''#include <stdio.h>

long long gcd(long long a, long long b) {
    while (b != 0) {
        long long r = a % b;
        a = b;
        b = r;
    }
    return a;
}

int main(void) {
    long long a, b;
    if (scanf("%lld %lld", &a, &b) != 2) return 1;
    long long g = gcd(a, b);
    printf("%lld %lld\n", g, a / g * b);
    return 0;
}
''', "a / g * b", "a * b"),
    "cpp": (r'''#include <bits/stdc++.h>
using namespace std;

int main() {
    long long a, b;
    cin >> a >> b;
    long long g = gcd(a, b);
    cout << g << " " << a / g * b << "\n";
}
''', "a / g * b", "a * b"),
    "java": (r'''public class Main {
    static long gcd(long a, long b) {
        return b == 0 ? a : gcd(b, a % b);
    }

    public static void main(String[] args) throws Exception {
        String[] t = new String(System.in.readAllBytes()).trim().split("\\s+");
        long a = Long.parseLong(t[0]), b = Long.parseLong(t[1]);
        long g = gcd(a, b);
        System.out.println(g + " " + (a / g * b));
    }
}
''', "a / g * b", "a * b"),
    "javascript": (r'''const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(/\s+/).map(BigInt);
let x = a, y = b;
while (y !== 0n) [x, y] = [y, x % y];
const g = x;
console.log(`${g} ${a / g * b}`);
''', "a / g * b", "a * b"),
    "go": (r'''package main

import "fmt"

func gcd(a, b int64) int64 {
    for b != 0 {
        a, b = b, a%b
    }
    return a
}

func main() {
    var a, b int64
    fmt.Scan(&a, &b)
    g := gcd(a, b)
    fmt.Println(g, a/g*b)
}
''', "a/g*b", "a*b"),
    "rust": (r'''use std::io::Read;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn main() {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).unwrap();
    let v: Vec<u64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
    let (a, b) = (v[0], v[1]);
    let g = gcd(a, b);
    println!("{} {}", g, a / g * b);
}
''', "a / g * b", "a * b"),
}

PROGRAMS["fizzbuzz"] = {
    "c": (r'''#include <stdio.h>

int main(void) {
    int n;
    if (scanf("%d", &n) != 1) return 1;
    for (int i = 1; i <= n; i++) {
        if (i % 15 == 0) printf("FizzBuzz\n");
        else if (i % 3 == 0) printf("Fizz\n");
        else if (i % 5 == 0) printf("Buzz\n");
        else printf("%d\n", i);
    }
    return 0;
}
''', "i <= n", "i < n"),
    "cpp": (r'''#include <bits/stdc++.h>
using namespace std;

int main() {
    int n;
    cin >> n;
    for (int i = 1; i <= n; i++) {
        if (i % 15 == 0) cout << "FizzBuzz\n";
        else if (i % 3 == 0) cout << "Fizz\n";
        else if (i % 5 == 0) cout << "Buzz\n";
        else cout << i << "\n";
    }
}
''', "i <= n", "i < n"),
    "java": (r'''public class Main {
    public static void main(String[] args) throws Exception {
        int n = Integer.parseInt(new String(System.in.readAllBytes()).trim());
        StringBuilder out = new StringBuilder();
        for (int i = 1; i <= n; i++) {
            if (i % 15 == 0) out.append("FizzBuzz");
            else if (i % 3 == 0) out.append("Fizz");
            else if (i % 5 == 0) out.append("Buzz");
            else out.append(i);
            out.append('\n');
        }
        System.out.print(out);
    }
}
''', "i <= n", "i < n"),
    "javascript": (r'''const n = Number(require('fs').readFileSync(0, 'utf8').trim());
const out = [];
for (let i = 1; i <= n; i++) {
  if (i % 15 === 0) out.push('FizzBuzz');
  else if (i % 3 === 0) out.push('Fizz');
  else if (i % 5 === 0) out.push('Buzz');
  else out.push(String(i));
}
console.log(out.join('\n'));
''', "i <= n", "i < n"),
    "go": (r'''package main

import "fmt"

func main() {
    var n int
    fmt.Scan(&n)
    for i := 1; i <= n; i++ {
        switch {
        case i%15 == 0:
            fmt.Println("FizzBuzz")
        case i%3 == 0:
            fmt.Println("Fizz")
        case i%5 == 0:
            fmt.Println("Buzz")
        default:
            fmt.Println(i)
        }
    }
}
''', "i <= n", "i < n"),
    "rust": (r'''use std::io::Read;

fn main() {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).unwrap();
    let n: u32 = s.trim().parse().unwrap();
    for i in 1..=n {
        if i % 15 == 0 {
            println!("FizzBuzz");
        } else if i % 3 == 0 {
            println!("Fizz");
        } else if i % 5 == 0 {
            println!("Buzz");
        } else {
            println!("{}", i);
        }
    }
}
''', "1..=n", "1..n"),
}

PROGRAMS["sum_csv"] = {
    "c": (r'''#include <stdio.h>

int main(void) {
    long long sum = 0, x;
    while (scanf("%lld", &x) == 1) {
        sum += x;
        if (getchar() != ',') break;
    }
    printf("%lld\n", sum);
    return 0;
}
''', "sum += x;\n        if (getchar() != ',') break;", "if (getchar() != ',') break;\n        sum += x;"),
    "cpp": (r'''#include <bits/stdc++.h>
using namespace std;

int main() {
    string line, field;
    getline(cin, line);
    stringstream fields(line);
    long long sum = 0;
    while (getline(fields, field, ',')) sum += stoll(field);
    cout << sum << "\n";
}
''', "while (getline(fields, field, ','))", "while (getline(fields, field, ',') && !fields.eof())"),
    "java": (r'''public class Main {
    public static void main(String[] args) throws Exception {
        String[] fields = new String(System.in.readAllBytes()).trim().split(",");
        long sum = 0;
        for (int i = 0; i < fields.length; i++) sum += Long.parseLong(fields[i].trim());
        System.out.println(sum);
    }
}
''', "i < fields.length", "i < fields.length - 1"),
    "javascript": (r'''const fields = require('fs').readFileSync(0, 'utf8').trim().split(',');
let sum = 0;
for (let i = 0; i < fields.length; i++) sum += Number(fields[i]);
console.log(String(sum));
''', "i < fields.length", "i < fields.length - 1"),
    "go": (r'''package main

import (
    "fmt"
    "io"
    "os"
    "strconv"
    "strings"
)

func main() {
    data, _ := io.ReadAll(os.Stdin)
    fields := strings.Split(strings.TrimSpace(string(data)), ",")
    var sum int64
    for i := 0; i < len(fields); i++ {
        x, _ := strconv.ParseInt(strings.TrimSpace(fields[i]), 10, 64)
        sum += x
    }
    fmt.Println(sum)
}
''', "i < len(fields)", "i < len(fields)-1"),
    "rust": (r'''use std::io::Read;

fn main() {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).unwrap();
    let fields: Vec<&str> = s.trim().split(',').collect();
    let mut sum = 0i64;
    for i in 0..fields.len() {
        sum += fields[i].trim().parse::<i64>().unwrap();
    }
    println!("{}", sum);
}
''', "0..fields.len()", "0..fields.len() - 1"),
}

PROGRAMS["sort_numbers"] = {
    "c": (r'''#include <stdio.h>
#include <stdlib.h>

static long long a[100000];

static int cmp(const void *p, const void *q) {
    long long x = *(const long long *)p, y = *(const long long *)q;
    return (x > y) - (x < y);
}

int main(void) {
    int n;
    if (scanf("%d", &n) != 1) return 1;
    for (int i = 0; i < n; i++)
        if (scanf("%lld", &a[i]) != 1) return 1;
    qsort(a, n, sizeof a[0], cmp);
    for (int i = 0; i < n; i++) printf("%lld%s", a[i], i + 1 < n ? " " : "");
    printf("\n");
    return 0;
}
''', "(x > y) - (x < y)", "(x < y) - (x > y)"),
    "cpp": (r'''#include <bits/stdc++.h>
using namespace std;

int main() {
    int n;
    cin >> n;
    vector<long long> a(n);
    for (auto &x : a) cin >> x;
    sort(a.begin(), a.end());
    for (int i = 0; i < n; i++) cout << a[i] << (i + 1 < n ? " " : "");
    cout << "\n";
}
''', "sort(a.begin(), a.end());", "sort(a.rbegin(), a.rend());"),
    "java": (r'''import java.util.Arrays;

public class Main {
    public static void main(String[] args) throws Exception {
        String[] t = new String(System.in.readAllBytes()).trim().split("\\s+");
        int n = Integer.parseInt(t[0]);
        long[] a = new long[n];
        for (int i = 0; i < n; i++) a[i] = Long.parseLong(t[i + 1]);
        Arrays.sort(a);
        StringBuilder out = new StringBuilder();
        for (int i = 0; i < n; i++) out.append(i > 0 ? " " : "").append(a[i]);
        System.out.println(out);
    }
}
''', "for (int i = 0; i < n; i++) out", "for (int i = 1; i < n; i++) out"),
    "javascript": (r'''const t = require('fs').readFileSync(0, 'utf8').trim().split(/\s+/).map(Number);
const a = t.slice(1, t[0] + 1);
a.sort((x, y) => x - y);
console.log(a.join(' '));
''', "a.sort((x, y) => x - y);", "a.sort();"),
    "go": (r'''package main

import (
    "bufio"
    "fmt"
    "os"
    "sort"
    "strconv"
    "strings"
)

func main() {
    reader := bufio.NewReader(os.Stdin)
    var n int
    fmt.Fscan(reader, &n)
    a := make([]int64, n)
    for i := range a {
        fmt.Fscan(reader, &a[i])
    }
    sort.Slice(a, func(i, j int) bool { return a[i] < a[j] })
    out := make([]string, n)
    for i, x := range a {
        out[i] = strconv.FormatInt(x, 10)
    }
    fmt.Println(strings.Join(out, " "))
}
''', "a[i] < a[j]", "a[i] > a[j]"),
    "rust": (r'''use std::io::Read;

fn main() {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).unwrap();
    let t: Vec<i64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
    let n = t[0] as usize;
    let mut a: Vec<i64> = t[1..=n].to_vec();
    a.sort();
    let out: Vec<String> = a.iter().map(|x| x.to_string()).collect();
    println!("{}", out.join(" "));
}
''', "a.sort();", "a.sort_by(|x, y| y.cmp(x));"),
}

PROGRAMS["count_bits"] = {
    "c": (r'''#include <stdio.h>

int main(void) {
    int q;
    if (scanf("%d", &q) != 1) return 1;
    for (int k = 0; k < q; k++) {
        unsigned long long x;
        if (scanf("%llu", &x) != 1) return 1;
        int c = 0;
        while (x > 0) {
            c += x & 1;
            x >>= 1;
        }
        printf("%d%s", c, k + 1 < q ? " " : "");
    }
    printf("\n");
    return 0;
}
''', "x > 0", "x > 1"),
    "cpp": (r'''#include <bits/stdc++.h>
using namespace std;

int main() {
    int q;
    cin >> q;
    for (int k = 0; k < q; k++) {
        unsigned long long x;
        cin >> x;
        int c = 0;
        while (x > 0) {
            c += x & 1;
            x >>= 1;
        }
        cout << c << (k + 1 < q ? " " : "");
    }
    cout << "\n";
}
''', "x > 0", "x > 1"),
    "java": (r'''public class Main {
    public static void main(String[] args) throws Exception {
        String[] t = new String(System.in.readAllBytes()).trim().split("\\s+");
        int q = Integer.parseInt(t[0]);
        StringBuilder out = new StringBuilder();
        for (int k = 0; k < q; k++) {
            long x = Long.parseLong(t[k + 1]);
            int c = 0;
            while (x > 0) {
                c += (int) (x & 1);
                x >>= 1;
            }
            out.append(k > 0 ? " " : "").append(c);
        }
        System.out.println(out);
    }
}
''', "x > 0", "x > 1"),
    "javascript": (r'''const t = require('fs').readFileSync(0, 'utf8').trim().split(/\s+/);
const q = Number(t[0]);
const out = [];
for (let k = 0; k < q; k++) {
  let x = BigInt(t[k + 1]);
  let c = 0;
  while (x > 0n) {
    c += Number(x & 1n);
    x >>= 1n;
  }
  out.push(c);
}
console.log(out.join(' '));
''', "x > 0n", "x > 1n"),
    "go": (r'''package main

import (
    "bufio"
    "fmt"
    "os"
    "strings"
)

func main() {
    reader := bufio.NewReader(os.Stdin)
    var q int
    fmt.Fscan(reader, &q)
    out := []string{}
    for k := 0; k < q; k++ {
        var x uint64
        fmt.Fscan(reader, &x)
        c := 0
        for x > 0 {
            c += int(x & 1)
            x >>= 1
        }
        out = append(out, fmt.Sprint(c))
    }
    fmt.Println(strings.Join(out, " "))
}
''', "x > 0", "x > 1"),
    "rust": (r'''use std::io::Read;

fn main() {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).unwrap();
    let t: Vec<u64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
    let q = t[0] as usize;
    let mut out = Vec::new();
    for k in 0..q {
        let mut x = t[k + 1];
        let mut c = 0;
        while x > 0 {
            c += x & 1;
            x >>= 1;
        }
        out.push(c.to_string());
    }
    println!("{}", out.join(" "));
}
''', "x > 0", "x > 1"),
}

PROGRAMS["count_distinct"] = {
    "c": (r'''#include <stdio.h>
#include <stdlib.h>

static long long a[100000];

static int cmp(const void *p, const void *q) {
    long long x = *(const long long *)p, y = *(const long long *)q;
    return (x > y) - (x < y);
}

int main(void) {
    int n;
    if (scanf("%d", &n) != 1) return 1;
    for (int i = 0; i < n; i++)
        if (scanf("%lld", &a[i]) != 1) return 1;
    qsort(a, n, sizeof a[0], cmp);
    int distinct = n > 0;
    for (int i = 1; i < n; i++)
        if (a[i] != a[i - 1]) distinct++;
    printf("%d\n", distinct);
    return 0;
}
''', "    qsort(a, n, sizeof a[0], cmp);\n", ""),
    "cpp": (r'''#include <bits/stdc++.h>
using namespace std;

int main() {
    int n;
    cin >> n;
    set<long long> seen;
    for (int i = 0; i < n; i++) {
        long long x;
        cin >> x;
        seen.insert(x);
    }
    cout << seen.size() << "\n";
}
''', "i < n;", "i < n - 1;"),
    "java": (r'''import java.util.HashSet;
import java.util.Set;

public class Main {
    public static void main(String[] args) throws Exception {
        String[] t = new String(System.in.readAllBytes()).trim().split("\\s+");
        int n = Integer.parseInt(t[0]);
        Set<Long> seen = new HashSet<>();
        for (int i = 0; i < n; i++) seen.add(Long.parseLong(t[i + 1]));
        System.out.println(seen.size());
    }
}
''', "i < n;", "i < n - 1;"),
    "javascript": (r'''const t = require('fs').readFileSync(0, 'utf8').trim().split(/\s+/).map(Number);
const n = t[0];
console.log(String(new Set(t.slice(1, n + 1)).size));
''', "t.slice(1, n + 1)", "t.slice(1, n)"),
    "go": (r'''package main

import (
    "bufio"
    "fmt"
    "os"
)

func main() {
    reader := bufio.NewReader(os.Stdin)
    var n int
    fmt.Fscan(reader, &n)
    seen := map[int64]bool{}
    for i := 0; i < n; i++ {
        var x int64
        fmt.Fscan(reader, &x)
        seen[x] = true
    }
    fmt.Println(len(seen))
}
''', "i < n;", "i < n-1;"),
    "rust": (r'''use std::collections::HashSet;
use std::io::Read;

fn main() {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).unwrap();
    let t: Vec<i64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
    let n = t[0] as usize;
    let seen: HashSet<i64> = t[1..=n].iter().copied().collect();
    println!("{}", seen.len());
}
''', "t[1..=n]", "t[1..n]"),
}

PROGRAMS["most_frequent_word"] = {
    "c": (r'''#include <stdio.h>
#include <string.h>

static char words[1000][64];
static int counts[1000];

int main(void) {
    char w[64];
    int n = 0;
    while (scanf("%63s", w) == 1) {
        int j = 0;
        while (j < n && strcmp(words[j], w) != 0) j++;
        if (j == n) {
            if (n == 1000) return 1;
            strcpy(words[n++], w);
        }
        counts[j]++;
    }
    int best = 0;
    for (int j = 1; j < n; j++)
        if (counts[j] > counts[best] || (counts[j] == counts[best] && strcmp(words[j], words[best]) < 0))
            best = j;
    printf("%s %d\n", words[best], counts[best]);
    return 0;
}
''', "strcmp(words[j], words[best]) < 0", "strcmp(words[j], words[best]) > 0"),
    "cpp": (r'''#include <bits/stdc++.h>
using namespace std;

int main() {
    map<string, int> counts;
    string w;
    while (cin >> w) counts[w]++;
    string best;
    int bestCount = 0;
    for (const auto &[word, c] : counts)
        if (c > bestCount) {
            best = word;
            bestCount = c;
        }
    cout << best << " " << bestCount << "\n";
}
''', "c > bestCount", "c >= bestCount"),
    "java": (r'''import java.util.Map;
import java.util.TreeMap;

public class Main {
    public static void main(String[] args) throws Exception {
        String[] words = new String(System.in.readAllBytes()).trim().split("\\s+");
        TreeMap<String, Integer> counts = new TreeMap<>();
        for (String w : words) counts.merge(w, 1, Integer::sum);
        String best = "";
        int bestCount = 0;
        for (Map.Entry<String, Integer> e : counts.entrySet())
            if (e.getValue() > bestCount) {
                best = e.getKey();
                bestCount = e.getValue();
            }
        System.out.println(best + " " + bestCount);
    }
}
''', "e.getValue() > bestCount", "e.getValue() >= bestCount"),
    "javascript": (r'''const words = require('fs').readFileSync(0, 'utf8').trim().split(/\s+/);
const counts = new Map();
for (const w of words) counts.set(w, (counts.get(w) || 0) + 1);
let best = '';
let bestCount = 0;
for (const w of [...counts.keys()].sort()) {
  if (counts.get(w) > bestCount) {
    best = w;
    bestCount = counts.get(w);
  }
}
console.log(`${best} ${bestCount}`);
''', "counts.get(w) > bestCount", "counts.get(w) >= bestCount"),
    "go": (r'''package main

import (
    "bufio"
    "fmt"
    "os"
    "sort"
)

func main() {
    reader := bufio.NewReader(os.Stdin)
    counts := map[string]int{}
    for {
        var w string
        if _, err := fmt.Fscan(reader, &w); err != nil {
            break
        }
        counts[w]++
    }
    keys := make([]string, 0, len(counts))
    for w := range counts {
        keys = append(keys, w)
    }
    sort.Strings(keys)
    best, bestCount := "", 0
    for _, w := range keys {
        if counts[w] > bestCount {
            best, bestCount = w, counts[w]
        }
    }
    fmt.Println(best, bestCount)
}
''', "counts[w] > bestCount", "counts[w] >= bestCount"),
    "rust": (r'''use std::collections::BTreeMap;
use std::io::Read;

fn main() {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).unwrap();
    let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
    for w in s.split_whitespace() {
        *counts.entry(w).or_insert(0) += 1;
    }
    let mut best = "";
    let mut best_count = 0;
    for (&w, &c) in &counts {
        if c > best_count {
            best = w;
            best_count = c;
        }
    }
    println!("{} {}", best, best_count);
}
''', "c > best_count", "c >= best_count"),
}

PROGRAMS["transpose"] = {
    "c": (r'''#include <stdio.h>

static long long a[10000];

int main(void) {
    int r, c;
    if (scanf("%d %d", &r, &c) != 2) return 1;
    for (int k = 0; k < r * c; k++)
        if (scanf("%lld", &a[k]) != 1) return 1;
    for (int j = 0; j < c; j++) {
        for (int i = 0; i < r; i++) printf("%lld%s", a[i * c + j], i + 1 < r ? " " : "");
        printf("\n");
    }
    return 0;
}
''', "a[i * c + j]", "a[j * r + i]"),
    "cpp": (r'''#include <bits/stdc++.h>
using namespace std;

int main() {
    int r, c;
    cin >> r >> c;
    vector<long long> a(r * c);
    for (auto &x : a) cin >> x;
    for (int j = 0; j < c; j++) {
        for (int i = 0; i < r; i++) cout << a[i * c + j] << (i + 1 < r ? " " : "");
        cout << "\n";
    }
}
''', "a[i * c + j]", "a[j * r + i]"),
    "java": (r'''public class Main {
    public static void main(String[] args) throws Exception {
        String[] t = new String(System.in.readAllBytes()).trim().split("\\s+");
        int r = Integer.parseInt(t[0]), c = Integer.parseInt(t[1]);
        StringBuilder out = new StringBuilder();
        for (int j = 0; j < c; j++) {
            for (int i = 0; i < r; i++) out.append(i > 0 ? " " : "").append(t[2 + i * c + j]);
            out.append('\n');
        }
        System.out.print(out);
    }
}
''', "t[2 + i * c + j]", "t[2 + j * r + i]"),
    "javascript": (r'''const t = require('fs').readFileSync(0, 'utf8').trim().split(/\s+/).map(Number);
const [r, c] = t;
const lines = [];
for (let j = 0; j < c; j++) {
  const row = [];
  for (let i = 0; i < r; i++) row.push(t[2 + i * c + j]);
  lines.push(row.join(' '));
}
console.log(lines.join('\n'));
''', "t[2 + i * c + j]", "t[2 + j * r + i]"),
    "go": (r'''package main

import (
    "bufio"
    "fmt"
    "os"
    "strings"
)

func main() {
    reader := bufio.NewReader(os.Stdin)
    var r, c int
    fmt.Fscan(reader, &r, &c)
    a := make([]int64, r*c)
    for k := range a {
        fmt.Fscan(reader, &a[k])
    }
    for j := 0; j < c; j++ {
        row := make([]string, r)
        for i := 0; i < r; i++ {
            row[i] = fmt.Sprint(a[i*c+j])
        }
        fmt.Println(strings.Join(row, " "))
    }
}
''', "a[i*c+j]", "a[j*r+i]"),
    "rust": (r'''use std::io::Read;

fn main() {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).unwrap();
    let t: Vec<i64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
    let (r, c) = (t[0] as usize, t[1] as usize);
    let a = &t[2..];
    for j in 0..c {
        let row: Vec<String> = (0..r).map(|i| a[i * c + j].to_string()).collect();
        println!("{}", row.join(" "));
    }
}
''', "a[i * c + j]", "a[j * r + i]"),
}
