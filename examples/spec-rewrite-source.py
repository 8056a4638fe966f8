import csv
import sys
from collections import Counter


def count_words(path, min_length=3):
    """Count the words of a text file that are at least min_length letters long."""
    counts = Counter()
    with open(path, encoding="utf-8") as f:
        for line in f:
            for word in line.lower().split():
                word = word.strip(".,;:!?\"'()[]")
                if len(word) >= min_length:
                    counts[word] += 1
    return counts


def write_report(counts, out_path, top=20):
    """Write the most common words and their counts to a CSV file."""
    with open(out_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["word", "count"])
        for word, n in counts.most_common(top):
            writer.writerow([word, n])


def main(argv):
    if len(argv) < 3:
        print("usage: words.py INPUT OUTPUT [TOP]")
        return 1
    top = int(argv[3]) if len(argv) > 3 else 20
    counts = count_words(argv[1])
    write_report(counts, argv[2], top)
    total = sum(counts.values())
    print(f"{len(counts)} distinct words, {total} in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
