"""A tiny HTML inspector on html.parser: elements by id, data-value cells, links, scripts, SVGs."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    text: str = ""
    start: int = 0
    end: int = 0  # elements[start + 1:end] are this element's descendants


@dataclass
class Page:
    elements: list[Element] = field(default_factory=list)

    def by_id(self, element_id: str) -> Element:
        found = [e for e in self.elements if e.attrs.get("id") == element_id]
        assert len(found) == 1, f"{len(found)} elements with id {element_id!r}"
        return found[0]

    def tags(self, tag: str) -> list[Element]:
        return [e for e in self.elements if e.tag == tag]

    def with_attr(self, name: str, value: str | None = None) -> list[Element]:
        return [e for e in self.elements if name in e.attrs and (value is None or e.attrs[name] == value)]

    def inside(self, element: Element) -> list[Element]:
        return self.elements[element.start + 1 : element.end]

    def values_in(self, element: Element) -> list[str]:
        """The data-value attributes of an element and its descendants, in document order."""
        return [e.attrs["data-value"] for e in [element, *self.inside(element)] if "data-value" in e.attrs]

    def ids(self) -> list[str]:
        return [e.attrs["id"] for e in self.elements if "id" in e.attrs]


_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page()
        self.open: list[Element] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        index = len(self.page.elements)
        element = Element(tag=tag, attrs={k: v or "" for k, v in attrs}, start=index, end=index + 1)
        self.page.elements.append(element)
        if tag not in _VOID:
            self.open.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        index = len(self.page.elements)
        self.page.elements.append(Element(tag=tag, attrs={k: v or "" for k, v in attrs}, start=index, end=index + 1))

    def handle_endtag(self, tag: str) -> None:
        for index in range(len(self.open) - 1, -1, -1):
            if self.open[index].tag == tag:
                for element in self.open[index:]:
                    element.end = len(self.page.elements)
                del self.open[index:]
                break

    def handle_data(self, data: str) -> None:
        for element in self.open:
            element.text += data


def parse(html: str) -> Page:
    parser = _Parser()
    parser.feed(html)
    parser.close()
    for element in parser.open:  # unclosed at the end of the document
        element.end = len(parser.page.elements)
    return parser.page


def text_of(element: Element) -> str:
    return " ".join(element.text.split())
